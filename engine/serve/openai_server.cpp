#include "engine/serve/openai_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/core/error.h"
#include "engine/core/log.h"
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

// Walks all of `expected` whatever the input, so the time taken does not reveal how much of the
// key a guess got right.
bool sameKey(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i]) ^
            static_cast<unsigned char>(i < given.size() ? given[i] : 0);
  }
  return diff == 0;
}

}  // namespace

struct OpenAiServer::Impl {
  ChatBackend& backend;
  ServerOptions options;
  httplib::Server http;
  RequestQueue queue;
  std::stop_source shutdown;
  std::atomic<uint64_t> next_id{0};
  uint64_t id_salt = std::random_device{}();
  int64_t started_unix_s = unixNow();

  Impl(ChatBackend& b, ServerOptions o)
      : backend(b), options(std::move(o)), queue(options.max_waiting) {}

  openai::CompletionId newId(const std::string& model) {
    char hex[40];
    std::snprintf(hex, sizeof(hex), "chatcmpl-%016llx%08llx",
                  static_cast<unsigned long long>(id_salt),
                  static_cast<unsigned long long>(next_id.fetch_add(1)));
    return {hex, unixNow(), model};
  }

  bool authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    return sameKey(req.get_header_value("Authorization"), "Bearer " + options.api_key);
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
                   std::shared_ptr<RequestQueue::Ticket> ticket, httplib::Response& res);
  void answerStream(std::shared_ptr<const PreparedChat> chat,
                    std::shared_ptr<RequestQueue::Ticket> ticket, httplib::Response& res);
};

void OpenAiServer::Impl::routes() {
  http.set_payload_max_length(options.max_body_bytes);
  // One connection thread per running or waiting request, plus a few for /health and /v1/models.
  const size_t threads = options.max_waiting + 1 + 4;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 && !authorized(req)) {
      sendError(res, {401,
                      "Incorrect or missing API key: send 'Authorization: Bearer <key>' as given "
                      "to tandem serve --api-key.",
                      "invalid_request_error", "", "invalid_api_key"});
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
      sendError(res, {404, "Unknown endpoint " + req.method + " " + req.path + ".",
                      "invalid_request_error", "", "unknown_url"});
    } else {
      sendError(res,
                {res.status,
                 "The request could not be processed (HTTP " + std::to_string(res.status) + ").",
                 "invalid_request_error", "", ""});
    }
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        logError() << "serve: internal error: " << what;
        sendError(res, {500, "Internal server error: " + what, "server_error", "", ""});
      });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    sendJson(res, 200, {{"status", "ok"}});
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    sendJson(res, 200, openai::modelList(backend.modelIds(), started_unix_s));
  });
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    const std::vector<std::string> ids = backend.modelIds();
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
      sendError(res, {404, "The model '" + id + "' does not exist.", "invalid_request_error",
                      "model", "model_not_found"});
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
      throw RequestError(
          {404, "The model '" + request.model + "' does not exist; this server has: " + known + ".",
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
    answerWhole(std::move(chat), std::move(ticket), res);
  }
}

void OpenAiServer::Impl::answerWhole(std::shared_ptr<const PreparedChat> chat,
                                     std::shared_ptr<RequestQueue::Ticket> ticket,
                                     httplib::Response& res) {
  if (!ticket->waitForTurn(shutdown.get_token())) {
    sendError(res,
              {503, "The server is shutting down.", "server_error", "", "server_shutting_down"});
    return;
  }
  const ChatResult result = backend.generate(
      *chat, [](std::string_view) { return true; }, shutdown.get_token());
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
  res.set_chunked_content_provider(
      "text/event-stream", [this, chat, ticket](size_t, httplib::DataSink& sink) {
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
                if (write(openai::sseEvent(openai::contentChunk(id, std::string(text)))))
                  return true;
                client_gone.request_stop();
                return false;
              },
              client_gone.get_token());
        } catch (const std::exception& e) {
          logError() << "serve: generation failed: " << e.what();
          write(openai::sseEvent(openai::errorBody(
              {500, std::string("Generation failed: ") + e.what(), "server_error", "", ""})));
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
    port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) port = 0;
  } else if (!impl_->http.bind_to_port(o.host, o.port)) {
    port = 0;
  }
  if (port <= 0) {
    throw Error(
        "cannot listen on " + o.host + ":" + std::to_string(o.port),
        "check that the host is an address of this machine and that no other program uses the port "
        "(--host, --port; --port 0 picks a free one)");
  }
  return port;
}

void OpenAiServer::serve() { impl_->http.listen_after_bind(); }

void OpenAiServer::stop() {
  impl_->shutdown.request_stop();
  impl_->queue.shutdown();
  impl_->http.stop();
}

}  // namespace tandem::serve
