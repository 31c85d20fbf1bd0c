#pragma once
// TCP endpoints of a data-parallel job's rendezvous (engine/model/process_group). Linux:
// getaddrinfo, socket, bind, listen, and a connected UDP socket's getsockname for the route's
// source address. Windows: not available (listenTcp throws Error, localAddressTowards says "").

#include <string>

namespace tandem::platform {

// A socket listening on exactly `address`:`port` (SO_REUSEADDR, close-on-exec), for c10d's
// TCPStore to take over: its own server would listen on every interface. Throws Error saying
// what to set when the address does not resolve or the port cannot be bound.
int listenTcp(const std::string& address, int port);

// The address of this machine the OS would use to reach `host`:`port`; "" when it cannot tell.
std::string localAddressTowards(const std::string& host, int port);

}  // namespace tandem::platform
