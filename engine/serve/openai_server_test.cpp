// The HTTP layer against a scripted backend: status codes and bodies of the error paths, the SSE
// framing, the queue bound, cancellation when a client leaves (streaming or not), stop(), and the
// hostile requests of docs/serve.md's "Security" (nesting, Host, Origin, Content-Type, 500s). The
// model side is tested end to end by tests/serve/test_serve.py with the openai client.

#include "engine/serve/openai_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <nlohmann/json.hpp>
#include <thread>

namespace tandem::serve {
namespace {

using nlohmann::json;

// Answers "w0 w1 w2 ..." (max_new_tokens words), one word every `delay`.
class ScriptedBackend : public ChatBackend {
 public:
  std::chrono::milliseconds delay{0};
  std::atomic<int> generations{0};
  std::atomic<int> cancelled{0};
  std::atomic<bool> started{false};

  std::vector<std::string> modelIds() const override { return {"base", "tuned"}; }
  PreparedChat prepare(const openai::ChatRequest& request) const override {
    if (request.messages.back().content == "explode")
      throw std::runtime_error("cannot open /home/someone/secret/model.safetensors");
    if (request.messages.back().content == "too long") {
      throw openai::RequestError(
          {400, "context", "invalid_request_error", "messages", "context_length_exceeded"});
    }
    return {request, {1, 2, 3}, request.max_tokens.value_or(4)};
  }
  ChatResult generate(const PreparedChat& chat, const TextSink& on_text,
                      std::stop_token stop) override {
    ++generations;
    started = true;
    if (chat.request.messages.back().content == "fail later")
      throw std::runtime_error("cannot read /home/someone/secret/experts.bin");
    ChatResult result;
    for (int64_t i = 0; i < chat.max_new_tokens; ++i) {
      std::this_thread::sleep_for(delay);
      if (stop.stop_requested()) {
        ++cancelled;
        result.cancelled = true;
        break;
      }
      const std::string word =
          "w" + std::to_string(i) + (chat.request.model == "tuned" ? "t " : " ");
      result.text += word;
      if (!on_text(word)) {
        ++cancelled;
        result.cancelled = true;
        break;
      }
    }
    result.finish_reason = openai::FinishReason::Length;
    result.usage = {3, chat.max_new_tokens};
    return result;
  }
};

class ServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    options.port = 0;
    server_ = std::make_unique<OpenAiServer>(backend_, options);
    port_ = server_->bind();
    thread_ = std::jthread([this] { server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    thread_ = {};
  }
  httplib::Client client() { return httplib::Client("127.0.0.1", port_); }
  httplib::Result chat(const std::string& body, httplib::Headers headers = {}) {
    return client().Post("/v1/chat/completions", headers, body, "application/json");
  }

  ScriptedBackend backend_;
  std::unique_ptr<OpenAiServer> server_;
  std::jthread thread_;
  int port_ = 0;
};

const std::string kHello =
    R"({"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})";

json errorOf(const httplib::Result& res) { return json::parse(res->body)["error"]; }

TEST_F(ServerTest, AnswersAPlainChat) {
  start();
  const auto res = chat(kHello);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "w0 w1 w2 ");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(body["model"], "base");
  const auto models = client().Get("/v1/models");
  EXPECT_EQ(json::parse(models->body)["data"][1]["id"], "tuned");
  EXPECT_EQ(client().Get("/v1/models/tuned")->status, 200);
  EXPECT_EQ(errorOf(client().Get("/v1/models/nope"))["code"], "model_not_found");
}

TEST_F(ServerTest, StreamsServerSentEventsInOpenAisOrder) {
  start();
  const auto res =
      chat(R"({"model": "tuned", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                            "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> events;
  size_t at = 0;
  while (at < res->body.size()) {
    const size_t end = res->body.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    const std::string line = res->body.substr(at, end - at);
    ASSERT_EQ(line.rfind("data: ", 0), 0u) << line;
    if (line != "data: [DONE]") events.push_back(json::parse(line.substr(6)));
    at = end + 2;
  }
  EXPECT_TRUE(res->body.ends_with("data: [DONE]\n\n"));
  ASSERT_EQ(events.size(), 5u);  // role, two words, finish, usage
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "w0t ");
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "w1t ");
  EXPECT_EQ(events[3]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events[4]["usage"]["total_tokens"], 5);
  for (const json& e : events) EXPECT_EQ(e["id"], events[0]["id"]);
}

TEST_F(ServerTest, ErrorsHaveTheRightStatusAndTheServerKeepsServing) {
  ServerOptions options;
  options.api_key = "sekrit";
  options.max_body_bytes = 4096;
  options.max_tokens_limit = 64;
  start(options);
  const httplib::Headers key = {{"Authorization", "Bearer sekrit"}};
  EXPECT_EQ(chat(kHello)->status, 401);
  EXPECT_EQ(errorOf(chat(kHello, {{"Authorization", "Bearer wrong"}}))["code"], "invalid_api_key");
  EXPECT_EQ(client().Get("/v1/models")->status, 401);
  EXPECT_EQ(client().Get("/health")->status, 200);  // liveness needs no key
  EXPECT_EQ(chat("{not json", key)->status, 400);
  EXPECT_EQ(errorOf(chat(R"({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]})",
                         key))["code"],
            "model_not_found");
  EXPECT_EQ(
      chat(R"({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]})", key)->status,
      404);
  const auto huge = chat(
      R"({"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000})",
      key);
  EXPECT_EQ(huge->status, 400);
  EXPECT_EQ(errorOf(huge)["param"], "max_tokens");
  EXPECT_EQ(
      errorOf(chat(R"({"model": "base", "messages": [{"role": "user", "content": "too long"}]})",
                   key))["code"],
      "context_length_exceeded");
  const std::string big = R"({"model": "base", "messages": [{"role": "user", "content": ")" +
                          std::string(8192, 'a') + "\"}]}";
  const auto too_big = chat(big, key);
  ASSERT_TRUE(too_big);
  EXPECT_EQ(too_big->status, 413);
  EXPECT_EQ(errorOf(too_big)["code"], "request_too_large");
  EXPECT_EQ(errorOf(client().Get("/v2/nothing"))["code"], "unknown_url");
  EXPECT_EQ(backend_.generations.load(), 0);
  const auto ok = chat(kHello, key);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(ServerTest, AFullQueueAnswers503) {
  backend_.delay = std::chrono::milliseconds(200);
  ServerOptions options;
  options.max_waiting = 1;
  start(options);
  std::jthread first([this] { EXPECT_EQ(chat(kHello)->status, 200); });
  while (!backend_.started) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::jthread second([this] { EXPECT_EQ(chat(kHello)->status, 200); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the second one queue
  const auto busy = chat(kHello);
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 503);
  EXPECT_EQ(errorOf(busy)["code"], "server_busy");
}

TEST_F(ServerTest, AStreamingClientThatLeavesCancelsItsGeneration) {
  backend_.delay = std::chrono::milliseconds(20);
  start();
  httplib::Client c = client();
  int chunks = 0;
  const std::string body =
      R"({"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "stream": true})";
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 4; };
  c.send(req);  // the receiver's false closes the connection after a few chunks
  for (int i = 0; i < 200 && backend_.cancelled == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend_.cancelled.load(), 1);
  const auto after = chat(kHello);  // the model is free again
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
}

TEST_F(ServerTest, StopCancelsTheRunningGeneration) {
  backend_.delay = std::chrono::milliseconds(20);
  start();
  std::jthread streaming([this] {
    chat(
        R"({"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000, "stream": true})");
  });
  while (!backend_.started) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server_->stop();
  thread_ = {};  // serve() returned
  EXPECT_EQ(backend_.cancelled.load(), 1);
}

// 200 KB of nesting in the fields the server compares or copies: each used to overflow the
// stack of the connection thread (SIGSEGV, the whole server gone). No key, the default.
TEST_F(ServerTest, DeeplyNestedBodiesAre400AndTheServerKeepsServing) {
  start();
  const size_t depth = 100000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  const std::string head = R"({"model": "base", "messages": [{"role": "user", "content": "hi"}], )";
  for (const std::string& body :
       {head + R"("response_format": {"type": )" + nested + "}}",
        head + R"("max_tokens": )" + nested + R"(, "max_completion_tokens": )" + nested + "}",
        head + R"("response_format": )" + nested + "}"}) {
    const auto res = chat(body);
    ASSERT_TRUE(res) << "the server died";
    EXPECT_EQ(res->status, 400);
    EXPECT_EQ(errorOf(res)["code"], "invalid_json");
  }
  ASSERT_TRUE(chat(kHello));
  EXPECT_EQ(chat(kHello)->status, 200);
}

TEST_F(ServerTest, PostBodiesMustBeJson) {
  start();
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded", ""}) {
    const auto res = client().Post("/v1/chat/completions", kHello, type);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 415) << type;
    EXPECT_EQ(errorOf(res)["code"], "unsupported_media_type");
  }
  EXPECT_EQ(
      client().Post("/v1/chat/completions", kHello, "application/json; charset=utf-8")->status,
      200);
}

TEST_F(ServerTest, ForeignOriginsAndHostsAreRefused) {
  start();
  const std::string own = "127.0.0.1:" + std::to_string(port_);
  auto res = chat(kHello, {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 403);
  EXPECT_EQ(errorOf(res)["code"], "cross_origin_refused");
  EXPECT_EQ(chat(kHello, {{"Origin", "http://" + own}})->status, 200);
  EXPECT_EQ(client().Get("/health", {{"Origin", "null"}})->status, 403);

  httplib::Client rebound("127.0.0.1", port_);  // what a DNS-rebound page's request looks like
  rebound.set_default_headers({{"Host", "evil.example:" + std::to_string(port_)}});
  res = rebound.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 421);
  EXPECT_EQ(errorOf(res)["code"], "invalid_host");
  httplib::Client by_name("localhost", port_);
  EXPECT_EQ(by_name.Get("/health")->status, 200);
}

TEST_F(ServerTest, InternalErrorsTellTheClientNothing) {
  start();
  const auto res =
      chat(R"({"model": "base", "messages": [{"role": "user", "content": "explode"}]})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  EXPECT_EQ(res->body.find("secret"), std::string::npos) << res->body;
  EXPECT_EQ(errorOf(res)["type"], "server_error");
  EXPECT_EQ(chat(kHello)->status, 200);
  const auto stream = chat(
      R"({"model": "base", "messages": [{"role": "user", "content": "fail later"}], "stream": true})");
  ASSERT_TRUE(stream);
  EXPECT_NE(stream->body.find("Generation failed; the server's log has the details."),
            std::string::npos)
      << stream->body;
  EXPECT_EQ(stream->body.find("secret"), std::string::npos) << stream->body;
}

// Nothing is written to a plain (non-streaming) client before its answer is whole, so leaving is
// seen on the socket: the generation stops rather than running on for nobody.
TEST_F(ServerTest, APlainClientThatLeavesCancelsItsGeneration) {
  backend_.delay = std::chrono::milliseconds(20);
  start();
  httplib::Client c = client();
  c.set_read_timeout(std::chrono::milliseconds(300));  // gives up long before 1000 words
  const auto gone = c.Post("/v1/chat/completions",
                           R"({"model": "base", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 1000})",
                           "application/json");
  EXPECT_FALSE(gone);
  c.stop();
  for (int i = 0; i < 500 && backend_.cancelled == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend_.cancelled.load(), 1);
  EXPECT_EQ(chat(kHello)->status, 200);
}

// A plain client that gives up while its request still waits behind another generation leaves
// the queue: the model never generates for it.
TEST_F(ServerTest, APlainClientThatLeavesWhileQueuedNeverGenerates) {
  backend_.delay = std::chrono::milliseconds(20);
  start();
  std::jthread running([this] {
    chat(R"({"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60})");
  });
  while (!backend_.started) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  httplib::Client c = client();
  c.set_read_timeout(std::chrono::milliseconds(300));  // gives up while the first one runs
  EXPECT_FALSE(c.Post("/v1/chat/completions", kHello, "application/json"));
  c.stop();
  running = {};  // the first generation (~1.2 s) is answered
  EXPECT_EQ(chat(kHello)->status, 200);
  EXPECT_EQ(backend_.generations.load(), 2);  // the first and the last; none for the one that left
  EXPECT_EQ(backend_.cancelled.load(), 0);
}

// The fuzzer's entry: raw bytes through httplib's parser and the same routes, no socket.
TEST_F(ServerTest, AnswersRawRequestsWithoutASocket) {
  start();
  const std::string host = "Host: 127.0.0.1:" + std::to_string(port_) + "\r\n";
  std::string out = server_->answerRaw("GET /health HTTP/1.1\r\n" + host + "\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 200", 0), 0u) << out;
  out = server_->answerRaw("POST /v1/chat/completions HTTP/1.1\r\n" + host +
                           "Content-Type: text/plain\r\nContent-Length: " +
                           std::to_string(kHello.size()) + "\r\n\r\n" + kHello);
  EXPECT_EQ(out.rfind("HTTP/1.1 415", 0), 0u) << out;
  out = server_->answerRaw("POST /v1/chat/completions HTTP/1.1\r\n" + host +
                           "Content-Type: application/json\r\nContent-Length: " +
                           std::to_string(kHello.size()) + "\r\n\r\n" + kHello);
  EXPECT_EQ(out.rfind("HTTP/1.1 200", 0), 0u) << out;
  EXPECT_NE(out.find("w0 w1 w2 "), std::string::npos);
  EXPECT_EQ(server_->answerRaw(std::string(100000, 'G')), "");  // no line end: closed, no answer
  std::string headers;
  for (int i = 0; i < 65; ++i) headers += "X-" + std::to_string(i) + ": x\r\n";
  out = server_->answerRaw("GET /health HTTP/1.1\r\n" + host + headers + "\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;  // more than 64 headers
  EXPECT_NE(out.find("The request could not be processed (HTTP 400)."), std::string::npos);
  out = server_->answerRaw("GET /health HTTP/1.1\r\n" + host + "X: " + std::string(9000, 'x') +
                           "\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;  // a header line over 8192 bytes
  out = server_->answerRaw("GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n" + host + "\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 414", 0), 0u) << out;  // a path over 8192 bytes
}

// A plain TCP connection to the server that sends nothing.
int connectIdle(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  timeval timeout{10, 0};  // generous: the server closes at once
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

TEST_F(ServerTest, ConnectionsPastTheIdleCapAreClosedAtOnce) {
  ServerOptions options;
  options.max_idle_connections = 2;
  start(options);
  const int first = connectIdle(port_);
  const int second = connectIdle(port_);
  const int third = connectIdle(port_);
  char byte = 0;
  EXPECT_EQ(::recv(third, &byte, 1, 0), 0);  // closed by the server, not timed out (-1)
  for (const int fd : {first, second, third}) ::close(fd);
  httplib::Client c = client();
  std::optional<httplib::Result> res;
  for (int i = 0; i < 100 && !(res && *res);
       ++i) {  // the listener may not have seen the closes yet
    res = c.Get("/health");
    if (!*res) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(*res);
  EXPECT_EQ((*res)->status, 200);
}

TEST_F(ServerTest, AConnectionServesAtMostKeepAliveMaxRequests) {
  ServerOptions options;
  options.keep_alive_max_requests = 2;
  start(options);
  httplib::Client c = client();
  c.set_keep_alive(true);
  const auto first = c.Get("/health");
  const auto second = c.Get("/health");
  ASSERT_TRUE(first && second);
  EXPECT_NE(first->get_header_value("Connection"), "close");
  EXPECT_EQ(second->get_header_value("Connection"), "close");
  EXPECT_EQ(c.Get("/health")->status, 200);  // a new connection
}

}  // namespace
}  // namespace tandem::serve
