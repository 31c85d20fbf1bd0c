// The request checks alone; tests/serve/test_hostile.py sends the same requests to a real
// `tandem serve`.

#include "engine/serve/request_guard.h"

#include <gtest/gtest.h>

namespace tandem::serve {
namespace {

const GuardConfig kLoopback{"127.0.0.1", 8000, ""};

RequestHead post(std::string_view host = "127.0.0.1:8000") {
  RequestHead head;
  head.method = "POST";
  head.path = "/v1/chat/completions";
  head.host = host;
  head.content_type = "application/json";
  return head;
}

int statusOf(const RequestHead& head, const GuardConfig& config = kLoopback) {
  const auto error = checkRequest(head, config);
  return error ? error->status : 0;
}

TEST(RequestGuard, LoopbackServerAnswersOnlyItsOwnHostNames) {
  for (const char* host : {"127.0.0.1:8000", "localhost:8000", "LocalHost:8000", "[::1]:8000", ""})
    EXPECT_EQ(statusOf(post(host)), 0) << host;
  for (const char* host : {"evil.example:8000", "127.0.0.1", "localhost:8001", "127.0.0.1:80000",
                           "localhost.evil.example:8000", "10.0.0.1:8000", ":8000"}) {
    EXPECT_EQ(statusOf(post(host)), 421) << host;
    EXPECT_EQ(checkRequest(post(host), kLoopback)->code, "invalid_host");
  }
  // Bound to another address, the server cannot know its names: Host is not checked.
  EXPECT_EQ(statusOf(post("evil.example:8000"), {"0.0.0.0", 8000, ""}), 0);
}

TEST(RequestGuard, ForeignOriginsAreRefusedSameOriginIsNot) {
  RequestHead head = post();
  head.has_origin = true;
  head.origin = "http://127.0.0.1:8000";
  EXPECT_EQ(statusOf(head), 0);
  for (const char* origin : {"http://evil.example", "null", "", "https://127.0.0.1:8000",
                             "http://localhost:8000", "http://127.0.0.1:8000.evil"}) {
    head.origin = origin;
    EXPECT_EQ(statusOf(head), 403) << origin;
  }
}

TEST(RequestGuard, PostBodiesMustBeJson) {
  RequestHead head = post();
  for (const char* type : {"application/json", "application/json; charset=utf-8",
                           "Application/JSON", " application/json ;charset=utf-8"}) {
    head.content_type = type;
    EXPECT_EQ(statusOf(head), 0) << type;
  }
  for (const char* type : {"text/plain", "", "application/x-www-form-urlencoded",
                           "multipart/form-data; boundary=x", "application/jsonp"}) {
    head.content_type = type;
    EXPECT_EQ(statusOf(head), 415) << type;
  }
  head.method = "GET";
  head.content_type = "";
  EXPECT_EQ(statusOf(head), 0);
}

TEST(RequestGuard, TheKeyGuardsV1Only) {
  const GuardConfig keyed{"127.0.0.1", 8000, "sekrit"};
  RequestHead head = post();
  EXPECT_EQ(statusOf(head, keyed), 401);
  head.authorization = "Bearer sekri";
  EXPECT_EQ(statusOf(head, keyed), 401);
  head.authorization = "Bearer sekrit!";
  EXPECT_EQ(statusOf(head, keyed), 401);
  head.authorization = "Bearer sekrit";
  EXPECT_EQ(statusOf(head, keyed), 0);
  RequestHead health;
  health.method = "GET";
  health.path = "/health";
  EXPECT_EQ(statusOf(health, keyed), 0);
}

TEST(RequestGuard, QuotedHeadersAreExcerpts) {
  const std::string huge(100000, 'h');
  RequestHead head = post(huge);
  EXPECT_LT(checkRequest(head, kLoopback)->message.size(), 400u);
  head = post();
  head.has_origin = true;
  head.origin = huge;
  EXPECT_LT(checkRequest(head, kLoopback)->message.size(), 400u);
  head = post();
  head.content_type = huge;
  EXPECT_LT(checkRequest(head, kLoopback)->message.size(), 400u);
}

TEST(RequestGuard, LoopbackAddresses) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"})
    EXPECT_TRUE(isLoopbackAddress(host)) << host;
  for (const char* host : {"0.0.0.0", "::", "192.168.1.2", "example.com", ""})
    EXPECT_FALSE(isLoopbackAddress(host)) << host;
}

}  // namespace
}  // namespace tandem::serve
