#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/platform/tcp_listen.h"

namespace tandem::platform {

int listenTcp(const std::string& address, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (const int rc = getaddrinfo(address.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    throw Error("cannot resolve MASTER_ADDR " + address + ": " + gai_strerror(rc),
                "set MASTER_ADDR to rank 0's address (an IP or a host name this machine resolves)");
  }
  std::string failure;
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    failure = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  throw Error("rank 0 cannot listen on " + address + ":" + port_text +
                  " for the job's rendezvous: " + failure,
              "MASTER_ADDR must be an address of rank 0's machine and MASTER_PORT a free port "
              "there (`tandem launch` on node 0 with --master ADDR:PORT)");
}

std::string localAddressTowards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return {};
  std::string local;
  const int fd = socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage self{};
  socklen_t len = sizeof self;
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        self.ss_family == AF_INET6
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&self)->sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&self)->sin_addr);
    if (inet_ntop(self.ss_family, raw, text, sizeof text)) local = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return local;
}

}  // namespace tandem::platform
