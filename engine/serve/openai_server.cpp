#include "engine/serve/openai_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/io/bounded_json.h"
#include "engine/serve/request_guard.h"
#include "engine/serve/request_queue.h"

namespace tandem::serve {

namespace {

using nlohmann::json;
using openai::ApiError;
using openai::RequestError;

void sendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void sendError(httplib::Response& res, const ApiError& error) {
  sendJson(res, error.status, openai::errorBody(error));
}

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Set by the post-routing handler when the response being written closes its connection.
thread_local bool t_close_connection = false;

// A connection's socket while no request on it is in progress, and how it got there.
struct IdleConnection {
  socket_t fd = INVALID_SOCKET;
  std::chrono::steady_clock::time_point since;
  size_t served = 0;  // requests answered on it so far
};

// httplib's Server with Tandem's own connection loop in place of listen_after_bind(): one
// listener thread polls the listening socket and every idle connection, and a worker thread takes
// a connection only once bytes of a request have arrived. A storm of idle or slow sockets
// therefore holds no thread while idle, and a slow one holds a thread for at most
// request_read_timeout_s: httplib's SocketStream enforces that as a deadline on all reads of the
// request (line, headers and body), where the plain read timeout restarts with every byte.
// Sockets go through httplib's portable wrappers (detail::), as its own loop does.
class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(const ServerOptions& options) : options_(options) {
    // httplib answers every error (a malformed line, too many headers, any 4xx/5xx) with
    // "Connection: close" but leaves closing to its own loop, which this one replaces.
    set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.get_header_value("Connection") == "close") t_close_connection = true;
    });
  }

  bool bindTo(const std::string& host, int port) { return bind_to_port(host, port); }
  int bindToAny(const std::string& host) { return bind_to_any_port(host); }

  // Serves until stopListening(); returns once every request in progress is answered.
  void serveConnections();
  void stopListening();

  // One connection's requests from memory: what the fuzzer drives.
  std::string answerRaw(std::string_view bytes, int port);

 private:
  // How often the listener looks at connections handed back by workers and at stopListening().
  static constexpr int kPollIntervalMs = 50;
  // How long a worker waits for the next request on its connection before handing it back: a
  // client that sends requests back to back keeps its thread, and one that pauses costs the
  // listener at most kPollIntervalMs of delay.
  static constexpr time_t kNextRequestGraceUs = 100'000;

  void pollOnce(std::vector<IdleConnection>& idle);
  void acceptReady(std::vector<IdleConnection>& idle);
  void serveConnection(IdleConnection connection);
  bool serveRequest(socket_t fd, bool last);

  const ServerOptions& options_;
  std::unique_ptr<httplib::ThreadPool> workers_;
  std::mutex returned_mutex_;
  std::vector<IdleConnection> returned_;  // back from workers, to be polled again
  std::atomic<bool> stopping_{false};
};

void closeSocket(socket_t fd) {
  httplib::detail::shutdown_socket(fd);
  httplib::detail::close_socket(fd);
}

}  // namespace

void HttpServer::serveConnections() {
  const socket_t listening = svr_sock_;
  if (listening != INVALID_SOCKET) httplib::detail::set_nonblocking(listening, true);
  // max_busy_connections threads at most; as many accepted requests may wait for one, beyond that
  // a connection is closed at once (the client sees a reset and may retry).
  workers_ = std::make_unique<httplib::ThreadPool>(
      std::min<size_t>(8, options_.max_busy_connections), options_.max_busy_connections,
      options_.max_busy_connections);
  std::vector<IdleConnection> idle;
  while (!stopping_.load() && svr_sock_ != INVALID_SOCKET) pollOnce(idle);
  for (const IdleConnection& c : idle) closeSocket(c.fd);
  workers_->shutdown();  // waits for the requests in progress
  std::lock_guard lock(returned_mutex_);
  for (const IdleConnection& c : returned_) closeSocket(c.fd);
  returned_.clear();
}

void HttpServer::pollOnce(std::vector<IdleConnection>& idle) {
  {
    std::lock_guard lock(returned_mutex_);
    idle.insert(idle.end(), returned_.begin(), returned_.end());
    returned_.clear();
  }
  std::vector<pollfd> fds{{svr_sock_, POLLIN, 0}};
  for (const IdleConnection& c : idle) fds.push_back({c.fd, POLLIN, 0});
  if (httplib::detail::poll_wrapper(fds.data(), static_cast<nfds_t>(fds.size()), kPollIntervalMs) <
      0)
    return;  // interrupted; a closed listening socket ends the loop in the caller
  const auto now = std::chrono::steady_clock::now();
  std::vector<IdleConnection> still_idle;
  for (size_t i = 0; i < idle.size(); ++i) {
    const IdleConnection& c = idle[i];
    if (fds[i + 1].revents != 0) {  // bytes of a request, or the client closed: a worker reads
      if (!workers_->enqueue([this, c] { serveConnection(c); })) closeSocket(c.fd);
    } else if (now - c.since > std::chrono::seconds(options_.keep_alive_timeout_s)) {
      closeSocket(c.fd);
    } else {
      still_idle.push_back(c);
    }
  }
  idle = std::move(still_idle);
  if (fds[0].revents & POLLIN) acceptReady(idle);
}

// Takes every connection waiting in the backlog (the listening socket is non-blocking), so a
// burst of connections does not fill the backlog and delay the next client's connect.
void HttpServer::acceptReady(std::vector<IdleConnection>& idle) {
  for (;;) {
#ifdef SOCK_CLOEXEC
    const socket_t fd = ::accept4(svr_sock_, nullptr, nullptr, SOCK_CLOEXEC);
#else
    const socket_t fd = ::accept(svr_sock_, nullptr, nullptr);
#endif
    if (fd == INVALID_SOCKET) return;  // none left, the client left, or out of descriptors
    if (idle.size() >= options_.max_idle_connections) {
      closeSocket(fd);
      continue;
    }
    httplib::detail::set_socket_opt_time(fd, SOL_SOCKET, SO_RCVTIMEO,
                                         options_.request_read_timeout_s, 0);
    httplib::detail::set_socket_opt_time(fd, SOL_SOCKET, SO_SNDTIMEO,
                                         CPPHTTPLIB_SERVER_WRITE_TIMEOUT_SECOND, 0);
    idle.push_back({fd, std::chrono::steady_clock::now(), 0});
  }
}

// Answers the requests that arrive back to back, then hands the connection back to the listener
// (or closes it: an error, "Connection: close", the last request allowed, or shutdown).
void HttpServer::serveConnection(IdleConnection connection) {
  for (;;) {
    const bool last = connection.served + 1 >= options_.keep_alive_max_requests || stopping_.load();
    if (!serveRequest(connection.fd, last) || last || stopping_.load()) {
      closeSocket(connection.fd);
      return;
    }
    ++connection.served;
    if (httplib::detail::select_read(connection.fd, 0, kNextRequestGraceUs) <= 0) break;
  }
  std::lock_guard lock(returned_mutex_);
  returned_.push_back({connection.fd, std::chrono::steady_clock::now(), connection.served});
}

// One request; false when the connection is to be closed.
bool HttpServer::serveRequest(socket_t fd, bool last) {
  std::string remote_addr, local_addr;
  int remote_port = 0, local_port = 0;
  httplib::detail::get_remote_ip_and_port(fd, remote_addr, remote_port);
  httplib::detail::get_local_ip_and_port(fd, local_addr, local_port);
  bool closed = false;
  t_close_connection = false;
  httplib::detail::SocketStream stream(fd, options_.request_read_timeout_s, 0,
                                       CPPHTTPLIB_SERVER_WRITE_TIMEOUT_SECOND, 0,
                                       static_cast<time_t>(options_.request_read_timeout_s) * 1000,
                                       std::chrono::steady_clock::now());
  const bool ok = process_request(stream, remote_addr, remote_port, local_addr, local_port, last,
                                  closed, nullptr);
  return ok && !closed && !t_close_connection;
}

void HttpServer::stopListening() {
  stopping_.store(true);
  const socket_t fd = svr_sock_.exchange(INVALID_SOCKET);
  if (fd != INVALID_SOCKET) closeSocket(fd);
}

namespace {

// A connection in memory: reads come from the request bytes, writes are collected.
class MemoryStream : public httplib::Stream {
 public:
  explicit MemoryStream(std::string_view in) : in_(in) {}
  bool is_readable() const override { return !in_.empty(); }
  bool wait_readable() const override { return !in_.empty(); }
  bool wait_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size());
    std::copy_n(in_.data(), n, ptr);
    in_.remove_prefix(n);
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 40000;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  socket_t socket() const override { return INVALID_SOCKET; }
  time_t duration() const override { return 0; }
  std::string& out() { return out_; }

 private:
  std::string_view in_;
  std::string out_;
};

}  // namespace

std::string HttpServer::answerRaw(std::string_view bytes, int port) {
  MemoryStream stream(bytes);
  // As many requests as the bytes hold, each answered as on a kept-alive connection.
  for (size_t i = 0; i < options_.keep_alive_max_requests && stream.is_readable(); ++i) {
    bool closed = false;
    const bool last = i + 1 == options_.keep_alive_max_requests;
    t_close_connection = false;
    if (!process_request(stream, "127.0.0.1", 40000, "127.0.0.1", port, last, closed, nullptr) ||
        closed || t_close_connection)
      break;
  }
  return std::move(stream.out());
}

struct OpenAiServer::Impl {
  ChatBackend& backend;
  ServerOptions options;
  HttpServer http;
  RequestQueue queue;
  int port = 0;  // bound
  std::stop_source shutdown;
  std::atomic<uint64_t> next_id{0};
  uint64_t id_salt = std::random_device{}();
  int64_t started_unix_s = unixNow();

  Impl(ChatBackend& b, ServerOptions o)
      : backend(b),
        options(std::move(o)),
        http(options),
        queue(options.max_waiting),
        port(options.port) {}

  openai::CompletionId newId(const std::string& model) {
    char hex[40];
    std::snprintf(hex, sizeof(hex), "chatcmpl-%016llx%08llx",
                  static_cast<unsigned long long>(id_salt),
                  static_cast<unsigned long long>(next_id.fetch_add(1)));
    return {hex, unixNow(), model};
  }

  // The Host, Origin, Content-Type and key checks of request_guard.h.
  std::optional<ApiError> refusal(const httplib::Request& req) const {
    RequestHead head;
    head.method = req.method;
    head.path = req.path;
    const std::string host = req.get_header_value("Host");
    const std::string origin = req.get_header_value("Origin");
    const std::string content_type = req.get_header_value("Content-Type");
    const std::string authorization = req.get_header_value("Authorization");
    head.host = host;
    head.origin = origin;
    head.has_origin = req.has_header("Origin");
    head.content_type = content_type;
    head.authorization = authorization;
    return checkRequest(head, {options.host, port, options.api_key});
  }

  void routes();
  // One line per answered chat, so an operator sees traffic and cancellations.
  static void logChat(const openai::CompletionId& id, const ChatResult& result, bool stream) {
    logInfo() << "chat " << id.id << " model=" << id.model << (stream ? " stream" : "") << ": "
              << result.usage.prompt_tokens << " prompt + " << result.usage.completion_tokens
              << " completion tokens, "
              << (result.cancelled ? "cancelled" : openai::finishReasonName(result.finish_reason));
  }
  void chatCompletions(const httplib::Request& req, httplib::Response& res);
  void answerWhole(std::shared_ptr<const PreparedChat> chat,
                   std::shared_ptr<RequestQueue::Ticket> ticket, const httplib::Request& req,
                   httplib::Response& res);
  void answerStream(std::shared_ptr<const PreparedChat> chat,
                    std::shared_ptr<RequestQueue::Ticket> ticket, httplib::Response& res);
};

void OpenAiServer::Impl::routes() {
  http.set_payload_max_length(options.max_body_bytes);
  http.set_keep_alive_timeout(options.keep_alive_timeout_s);
  http.set_keep_alive_max_count(options.keep_alive_max_requests);
  http.set_read_timeout(options.request_read_timeout_s);

  // Before the body is read: a refused request costs no more than its headers.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (const std::optional<ApiError> error = refusal(req)) {
      sendError(res, *error);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib's own refusals (no route, body too large, unreadable request) get an OpenAI body.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      sendError(res, {413,
                      "The request body is larger than this server's limit of " +
                          std::to_string(options.max_body_bytes) +
                          " bytes (tandem serve --max-body-bytes).",
                      "invalid_request_error", "", "request_too_large"});
    } else if (res.status == 404) {
      sendError(res, {404,
                      "Unknown endpoint " + io::excerptForMessage(req.method, 16) + " " +
                          io::excerptForMessage(req.path, 80) + ".",
                      "invalid_request_error", "", "unknown_url"});
    } else {
      sendError(res,
                {res.status,
                 "The request could not be processed (HTTP " + std::to_string(res.status) + ").",
                 "invalid_request_error", "", ""});
    }
  });
  // The detail (a message, maybe a path) goes to the log only; the client learns nothing of it.
  http.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr error) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        logError() << "serve: internal error on " << io::excerptForMessage(req.path, 80) << ": "
                   << what;
        sendError(res, {500, "Internal server error; the server's log has the details.",
                        "server_error", "", ""});
      });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    sendJson(res, 200, {{"status", "ok"}});
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    sendJson(res, 200, openai::modelList(backend.modelIds(), started_unix_s));
  });
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];  // at most CPPHTTPLIB_REQUEST_URI_MAX_LENGTH
    const std::vector<std::string> ids = backend.modelIds();
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
      sendError(res, {404, "The model '" + io::excerptForMessage(id, 64) + "' does not exist.",
                      "invalid_request_error", "model", "model_not_found"});
      return;
    }
    sendJson(res, 200, openai::modelObject(id, started_unix_s));
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    chatCompletions(req, res);
  });
}

void OpenAiServer::Impl::chatCompletions(const httplib::Request& req, httplib::Response& res) {
  std::shared_ptr<const PreparedChat> chat;
  try {
    const openai::ChatRequest request =
        openai::parseChatRequest(req.body, options.max_tokens_limit);
    const std::vector<std::string> ids = backend.modelIds();
    if (std::find(ids.begin(), ids.end(), request.model) == ids.end()) {
      std::string known;
      for (const std::string& id : ids) known += (known.empty() ? "" : ", ") + id;
      throw RequestError({404,
                          "The model '" + io::excerptForMessage(request.model, 64) +
                              "' does not exist; this server has: " + known + ".",
                          "invalid_request_error", "model", "model_not_found"});
    }
    chat = std::make_shared<const PreparedChat>(backend.prepare(request));
  } catch (const RequestError& e) {
    sendError(res, e.error());
    return;
  }
  std::shared_ptr<RequestQueue::Ticket> ticket = queue.tryEnter();
  if (!ticket) {
    res.set_header("Retry-After", "1");
    sendError(res, {503,
                    "The server is busy: " + std::to_string(options.max_waiting) +
                        " requests are already waiting (tandem serve --queue). Retry later.",
                    "server_error", "", "server_busy"});
    return;
  }
  if (chat->request.stream) {
    answerStream(std::move(chat), std::move(ticket), res);
  } else {
    answerWhole(std::move(chat), std::move(ticket), req, res);
  }
}

void OpenAiServer::Impl::answerWhole(std::shared_ptr<const PreparedChat> chat,
                                     std::shared_ptr<RequestQueue::Ticket> ticket,
                                     const httplib::Request& req, httplib::Response& res) {
  // Nothing is written until the answer is whole, so a client that leaves is noticed by watching
  // its socket: while the request waits for its turn and while it generates.
  std::stop_source client_gone;
  std::stop_callback on_shutdown(shutdown.get_token(),
                                 [&client_gone] { client_gone.request_stop(); });
  std::jthread watch([&req, &client_gone](std::stop_token done) {
    std::mutex mutex;
    std::condition_variable_any never;
    std::unique_lock lock(mutex);
    while (!never.wait_for(lock, done, std::chrono::milliseconds(50), [] { return false; })) {
      if (done.stop_requested()) return;
      if (req.is_connection_closed()) {
        client_gone.request_stop();
        return;
      }
    }
  });
  if (!ticket->waitForTurn(client_gone.get_token())) {
    sendError(res, {503, "The server is shutting down, or the client left.", "server_error", "",
                    "server_shutting_down"});
    return;
  }
  const ChatResult result = backend.generate(
      *chat, [](std::string_view) { return true; }, client_gone.get_token());
  watch.request_stop();
  const openai::CompletionId id = newId(chat->request.model);
  logChat(id, result, /*stream=*/false);
  sendJson(res, 200, openai::completionObject(id, result.text, result.finish_reason, result.usage));
}

// The stream is written from the connection thread when httplib sends the body, so the ticket
// (the place in the queue) lives in the provider and is released when the response is destroyed,
// whether the stream finished, failed or the client left.
void OpenAiServer::Impl::answerStream(std::shared_ptr<const PreparedChat> chat,
                                      std::shared_ptr<RequestQueue::Ticket> ticket,
                                      httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, chat, ticket](
                                                            size_t, httplib::DataSink& sink) {
    const auto write = [&sink](const std::string& event) {
      return sink.write(event.data(), event.size());
    };
    // A client that leaves is noticed at the next write; its generation then stops.
    std::stop_source client_gone;
    std::stop_callback on_shutdown(shutdown.get_token(),
                                   [&client_gone] { client_gone.request_stop(); });
    if (!ticket->waitForTurn(client_gone.get_token())) return false;
    const openai::CompletionId id = newId(chat->request.model);
    if (!write(openai::sseEvent(openai::roleChunk(id)))) return false;
    ChatResult result;
    try {
      result = backend.generate(
          *chat,
          [&](std::string_view text) {
            if (write(openai::sseEvent(openai::contentChunk(id, std::string(text))))) return true;
            client_gone.request_stop();
            return false;
          },
          client_gone.get_token());
    } catch (const std::exception& e) {
      logError() << "serve: generation failed: " << e.what();
      write(openai::sseEvent(openai::errorBody(
          {500, "Generation failed; the server's log has the details.", "server_error", "", ""})));
      sink.done();
      return true;
    }
    logChat(id, result, /*stream=*/true);
    if (client_gone.stop_requested()) return false;
    bool ok = write(openai::sseEvent(openai::finishChunk(id, result.finish_reason)));
    if (ok && chat->request.include_usage)
      ok = write(openai::sseEvent(openai::usageChunk(id, result.usage)));
    if (ok) ok = write(openai::sseDone());
    if (ok) sink.done();
    return ok;
  });
}

OpenAiServer::OpenAiServer(ChatBackend& backend, ServerOptions options)
    : impl_(std::make_unique<Impl>(backend, std::move(options))) {
  impl_->routes();
}

OpenAiServer::~OpenAiServer() { stop(); }

int OpenAiServer::bind() {
  const ServerOptions& o = impl_->options;
  int port = o.port;
  if (o.port == 0) {
    port = impl_->http.bindToAny(o.host);
    if (port < 0) port = 0;
  } else if (!impl_->http.bindTo(o.host, o.port)) {
    port = 0;
  }
  if (port <= 0) {
    throw Error(
        "cannot listen on " + o.host + ":" + std::to_string(o.port),
        "check that the host is an address of this machine and that no other program uses the port "
        "(--host, --port; --port 0 picks a free one)");
  }
  impl_->port = port;
  return port;
}

void OpenAiServer::serve() { impl_->http.serveConnections(); }

std::string OpenAiServer::answerRaw(std::string_view bytes) {
  return impl_->http.answerRaw(bytes, impl_->port);
}

void OpenAiServer::stop() {
  impl_->shutdown.request_stop();
  impl_->queue.shutdown();
  impl_->http.stopListening();
}

}  // namespace tandem::serve
