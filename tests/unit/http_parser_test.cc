// The llhttp bridge (src/http/parser.h): every request and response is fed in one piece and
// one byte at a time (and in small pieces), and both runs must give the same heads, bodies,
// message boundaries and errors.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/parser.h"

using sluice::http::Header;
using sluice::http::MessageHead;
using sluice::http::Parser;
using sluice::http::ParserCallbacks;
using sluice::http::ParserLimits;
using namespace std::string_view_literals;

namespace {

struct Message {
  MessageHead head;
  std::string body;
  sluice::http::HeaderMap trailers;
  int trailer_calls = 0;
  bool complete = false;
};

class Recorder : public ParserCallbacks {
 public:
  int head_status = 0;  // what onMessageHead returns
  std::vector<Message> messages;
  int body_calls_without_message = 0;

  int onMessageHead(MessageHead& head) override {
    messages.push_back(Message{head, {}, {}, 0, false});
    return head_status;
  }
  void onMessageBody(const char* data, size_t len) override {
    if (messages.empty()) {
      ++body_calls_without_message;
      return;
    }
    messages.back().body.append(data, len);
  }
  void onMessageTrailers(sluice::http::HeaderMap& trailers) override {
    if (messages.empty()) return;
    messages.back().trailers = std::move(trailers);
    ++messages.back().trailer_calls;
  }
  void onMessageComplete() override {
    if (!messages.empty()) messages.back().complete = true;
  }
};

constexpr size_t kNone = static_cast<size_t>(-1);

struct Run {
  std::vector<Message> messages;
  std::vector<size_t> done_at;  // absolute offsets right after each MessageDone
  Parser::Status last = Parser::Status::NeedMore;
  size_t upgrade_at = kNone;  // absolute offset where the tunnel bytes start
  int error_status = 0;
  std::string error_reason;
  std::optional<Parser::Status> finish_status;
  int finish_error_status = 0;
  bool consumed_ok = true;  // NeedMore always consumed the whole piece
};

struct Options {
  ParserLimits limits{};
  int head_status = 0;
  bool expect_no_body = false;
  bool finish = false;
};

Run run(Parser::Type type, std::string_view input, size_t step, const Options& options = {}) {
  Recorder recorder;
  recorder.head_status = options.head_status;
  Parser parser(type, &recorder, options.limits);
  parser.setExpectNoBody(options.expect_no_body);
  Run out;
  size_t offset = 0;
  int guard = 0;
  while (offset < input.size() && ++guard < 1000000) {
    const size_t n = std::min(step, input.size() - offset);
    const Parser::Result r = parser.execute(input.data() + offset, n);
    out.last = r.status;
    if (r.status == Parser::Status::NeedMore) {
      if (r.consumed != n) out.consumed_ok = false;
      offset += n;
      continue;
    }
    if (r.status == Parser::Status::MessageDone) {
      if (r.consumed > n) out.consumed_ok = false;
      offset += std::min(r.consumed, n);
      out.done_at.push_back(offset);
      parser.resume();
      continue;
    }
    if (r.status == Parser::Status::Upgrade) {
      offset += std::min(r.consumed, n);
      out.upgrade_at = offset;
      break;
    }
    out.error_status = r.error_status;
    out.error_reason = r.error_reason;
    break;
  }
  if (options.finish && out.last != Parser::Status::Error && out.last != Parser::Status::Upgrade) {
    const Parser::Result r = parser.finish();
    out.finish_status = r.status;
    out.finish_error_status = r.error_status;
    if (r.status == Parser::Status::MessageDone) out.done_at.push_back(input.size());
  }
  out.messages = recorder.messages;
  return out;
}

// Control bytes made visible, so that a CR or LF inside a value shows in a failure.
std::string visible(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string describe(const MessageHead& h) {
  std::string out = h.method + " " + h.target + " " + std::to_string(h.status) + " " + h.reason +
                    " " + std::to_string(h.version_major) + "." + std::to_string(h.version_minor);
  for (const Header& f : h.headers) out += " [" + visible(f.name) + ": " + visible(f.value) + "]";
  out += " cl=" + (h.content_length ? std::to_string(*h.content_length) : std::string("-"));
  out += std::string(" chunked=") + (h.chunked ? "1" : "0");
  out += std::string(" keep_alive=") + (h.keep_alive ? "1" : "0");
  out += std::string(" upgrade=") + (h.upgrade ? "1" : "0");
  return out;
}

// `with_bodies` false: after an error, how much of the body was handed over before the
// refusal depends on the read boundaries, and that is fine.
std::string describe(const Run& r, bool with_bodies = true) {
  std::string out;
  for (const Message& m : r.messages) {
    out += describe(m.head);
    if (with_bodies) out += " body=" + std::to_string(m.body.size()) + ":" + visible(m.body);
    for (const Header& f : m.trailers)
      out += " {" + visible(f.name) + ": " + visible(f.value) + "}";
    out += m.complete ? " complete\n" : " incomplete\n";
  }
  out += "done_at:";
  for (size_t d : r.done_at) out += " " + std::to_string(d);
  out += "\nlast=" + std::to_string(static_cast<int>(r.last)) + " upgrade_at=" +
         (r.upgrade_at == kNone ? std::string("-") : std::to_string(r.upgrade_at)) +
         " error=" + std::to_string(r.error_status) + " (" + r.error_reason + ")";
  if (r.finish_status) {
    out += " finish=" + std::to_string(static_cast<int>(*r.finish_status)) + "/" +
           std::to_string(r.finish_error_status);
  }
  out += r.consumed_ok ? "" : " CONSUMED-MISMATCH";
  return out;
}

// Runs the input whole, one byte at a time and three bytes at a time; all three must agree
// (message boundaries, heads with their fragments joined, bodies, errors). Returns the whole run.
Run runAll(Parser::Type type, std::string_view input, const Options& options = {}) {
  const Run whole = run(type, input, input.size() == 0 ? 1 : input.size(), options);
  for (size_t step : {size_t{1}, size_t{3}}) {
    const Run pieces = run(type, input, step, options);
    INFO("step " << step);
    const bool with_bodies = whole.last != Parser::Status::Error;
    CHECK(describe(pieces, with_bodies) == describe(whole, with_bodies));
  }
  CHECK(whole.consumed_ok);
  return whole;
}

Run request(std::string_view input, const Options& options = {}) {
  return runAll(Parser::Type::Request, input, options);
}

Run response(std::string_view input, const Options& options = {}) {
  return runAll(Parser::Type::Response, input, options);
}

const std::string* header(const MessageHead& head, std::string_view name) {
  return head.headers.get(name);
}

void checkError(const Run& r, int status) {
  INFO(describe(r));
  CHECK(r.last == Parser::Status::Error);
  CHECK(r.error_status == status);
}

}  // namespace

TEST_SUITE("http parser: requests") {
  TEST_CASE("a GET head: method, target, version, headers in order, values trimmed") {
    const std::string input =
        "GET /a/b?x=1&y=%20 HTTP/1.1\r\n"
        "Host: example.com\r\n"
        "X-Spaced:   two  words \t \r\n"
        "x-lower-Case: v\r\n"
        "Empty:\r\n"
        "\r\n";
    const Run r = request(input);
    INFO(describe(r));
    REQUIRE(r.messages.size() == 1);
    const MessageHead& h = r.messages[0].head;
    CHECK(h.method == "GET");
    CHECK(h.target == "/a/b?x=1&y=%20");
    CHECK(h.version_major == 1);
    CHECK(h.version_minor == 1);
    CHECK_FALSE(h.isHttp10());
    REQUIRE(h.headers.size() == 4);
    CHECK(h.headers.fields()[0].name == "Host");
    CHECK(h.headers.fields()[0].value == "example.com");
    CHECK(h.headers.fields()[1].name == "X-Spaced");
    CHECK(h.headers.fields()[1].value == "two  words");
    CHECK(h.headers.fields()[2].name == "x-lower-Case");
    CHECK(h.headers.fields()[3].name == "Empty");
    CHECK(h.headers.fields()[3].value == "");
    CHECK_FALSE(h.content_length.has_value());
    CHECK_FALSE(h.chunked);
    CHECK(h.keep_alive);
    CHECK_FALSE(h.upgrade);
    CHECK_FALSE(h.hasBody());
    CHECK(r.messages[0].body.empty());
    CHECK(r.messages[0].complete);
    REQUIRE(r.done_at.size() == 1);
    CHECK(r.done_at[0] == input.size());
    CHECK(r.last == Parser::Status::MessageDone);
  }

  TEST_CASE("long header fragments are joined whatever the read boundaries") {
    const std::string long_value(3000, 'v');
    const std::string long_name = "X-" + std::string(200, 'n');
    const std::string input = "PUT /" + std::string(500, 'p') + " HTTP/1.1\r\nHost: h\r\n" +
                              long_name + ": " + long_value + "\r\n\r\n";
    const Run r = request(input);
    REQUIRE(r.messages.size() == 1);
    const MessageHead& h = r.messages[0].head;
    CHECK(h.method == "PUT");
    CHECK(h.target == "/" + std::string(500, 'p'));
    REQUIRE(h.headers.size() == 2);
    CHECK(h.headers.fields()[1].name == long_name);
    CHECK(h.headers.fields()[1].value == long_value);
  }

  TEST_CASE("a Content-Length body is handed to onMessageBody, then MessageDone") {
    const std::string input =
        "POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world";
    const Run r = request(input);
    INFO(describe(r));
    REQUIRE(r.messages.size() == 1);
    const MessageHead& h = r.messages[0].head;
    CHECK(h.method == "POST");
    REQUIRE(h.content_length.has_value());
    CHECK(*h.content_length == 11);
    CHECK_FALSE(h.chunked);
    CHECK(h.hasBody());
    CHECK(r.messages[0].body == "hello world");
    CHECK(r.messages[0].complete);
    REQUIRE(r.done_at.size() == 1);
    CHECK(r.done_at[0] == input.size());
  }

  TEST_CASE("Content-Length: 0 is a message without a body") {
    const std::string input = "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    const Run r = request(input);
    REQUIRE(r.messages.size() == 1);
    REQUIRE(r.messages[0].head.content_length.has_value());
    CHECK(*r.messages[0].head.content_length == 0);
    CHECK_FALSE(r.messages[0].head.hasBody());
    REQUIRE(r.done_at.size() == 1);
    CHECK(r.done_at[0] == input.size());
  }

  TEST_CASE("a chunked body is de-chunked (extensions dropped, trailers apart from the head)") {
    const std::string input =
        "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n"
        "6;ext=1\r\n world\r\n"
        "A\r\n0123456789\r\n"
        "0\r\nX-Trailer: t\r\n\r\n";
    const Run r = request(input);
    INFO(describe(r));
    REQUIRE(r.messages.size() == 1);
    const MessageHead& h = r.messages[0].head;
    CHECK(h.chunked);
    CHECK_FALSE(h.content_length.has_value());
    CHECK(h.hasBody());
    CHECK(r.messages[0].body == "hello world0123456789");
    CHECK(r.messages[0].complete);
    REQUIRE(r.done_at.size() == 1);
    CHECK(r.done_at[0] == input.size());
    // The trailer field is no field of the head: it comes once, apart, before the end.
    CHECK(h.headers.count("x-trailer") == 0);
    CHECK(r.messages[0].trailer_calls == 1);
    REQUIRE(r.messages[0].trailers.size() == 1);
    CHECK(r.messages[0].trailers.fields()[0].name == "X-Trailer");
    CHECK(r.messages[0].trailers.fields()[0].value == "t");
  }

  TEST_CASE("trailers: values trimmed, a section per message, none without fields") {
    const std::string first =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        "2\r\nab\r\n0\r\ngrpc-status:  0 \r\nGrpc-Message: fine\r\n\r\n";
    const std::string second =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nc\r\n0\r\n\r\n";
    const Run r = response(first + second);
    INFO(describe(r));
    REQUIRE(r.messages.size() == 2);
    REQUIRE(r.messages[0].trailers.size() == 2);
    CHECK(r.messages[0].trailers.fields()[0].value == "0");
    CHECK(*r.messages[0].trailers.get("grpc-message") == "fine");
    CHECK(r.messages[0].head.headers.count("grpc-status") == 0);
    CHECK(r.messages[1].trailer_calls == 0);
    CHECK(r.messages[1].body == "c");
  }

  TEST_CASE("trailers count with the head: field count and bytes, then bad framing in them") {
    Options limits;
    limits.limits.max_header_count = 3;
    std::string input =
        "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        "1\r\nx\r\n0\r\nA: 1\r\nB: 2\r\n\r\n";
    Run r = request(input, limits);
    INFO(describe(r, false));
    CHECK(r.last == Parser::Status::Error);
    CHECK(r.error_status == 431);
    // Obs-fold and a bare LF are refused in a trailer section as in a head.
    for (const char* bad : {"0\r\nA: 1\r\n folded\r\n\r\n", "0\r\nA: 1\n\r\n"}) {
      input = std::string("POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n") +
              "1\r\nx\r\n" + bad;
      r = request(input);
      CAPTURE(bad);
      CHECK(r.last == Parser::Status::Error);
      CHECK(r.error_status == 400);
    }
  }

  TEST_CASE("pipelined requests stop after each message; resume() goes on with the rest") {
    const std::string first = "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n";
    const std::string second = "POST /2 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
    const std::string third =
        "POST /3 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n0\r\n\r\n";
    const std::string fourth = "DELETE /4 HTTP/1.1\r\nHost: h\r\n\r\n";
    const std::string input = first + second + third + fourth;

    SUBCASE("the first execute() stops at the end of the first message") {
      Recorder recorder;
      Parser parser(Parser::Type::Request, &recorder, ParserLimits{});
      const Parser::Result r = parser.execute(input.data(), input.size());
      CHECK(r.status == Parser::Status::MessageDone);
      CHECK(r.consumed == first.size());
      CHECK(recorder.messages.size() == 1);
      CHECK_FALSE(parser.inMessage());
      // After resume(), the rest is parsed from where the first message ended.
      parser.resume();
      const Parser::Result r2 =
          parser.execute(input.data() + r.consumed, input.size() - r.consumed);
      CHECK(r2.status == Parser::Status::MessageDone);
      CHECK(r2.consumed == second.size());
      REQUIRE(recorder.messages.size() == 2);
      CHECK(recorder.messages[1].head.target == "/2");
      CHECK(recorder.messages[1].body == "abc");
    }

    SUBCASE("all four, in any piece sizes") {
      const Run r = request(input);
      INFO(describe(r));
      REQUIRE(r.messages.size() == 4);
      CHECK(r.messages[0].head.method == "GET");
      CHECK(r.messages[0].head.target == "/1");
      CHECK(r.messages[1].head.method == "POST");
      CHECK(r.messages[1].head.target == "/2");
      CHECK(r.messages[1].body == "abc");
      CHECK(r.messages[2].head.target == "/3");
      CHECK(r.messages[2].head.chunked);
      CHECK(r.messages[2].body == "xy");
      CHECK(r.messages[3].head.method == "DELETE");
      CHECK(r.messages[3].head.target == "/4");
      CHECK(r.messages[3].body.empty());
      for (const Message& m : r.messages) CHECK(m.complete);
      REQUIRE(r.done_at.size() == 4);
      CHECK(r.done_at[0] == first.size());
      CHECK(r.done_at[1] == first.size() + second.size());
      CHECK(r.done_at[2] == first.size() + second.size() + third.size());
      CHECK(r.done_at[3] == input.size());
    }
  }

  TEST_CASE("the head of the next pipelined message is fresh (no headers carried over)") {
    const std::string input =
        "GET /1 HTTP/1.1\r\nHost: a\r\nX-Only-First: 1\r\nContent-Length: 2\r\n\r\nok"
        "GET /2 HTTP/1.1\r\nHost: b\r\n\r\n";
    const Run r = request(input);
    REQUIRE(r.messages.size() == 2);
    CHECK(r.messages[1].head.headers.size() == 1);
    CHECK(header(r.messages[1].head, "x-only-first") == nullptr);
    CHECK_FALSE(r.messages[1].head.content_length.has_value());
    REQUIRE(header(r.messages[1].head, "host") != nullptr);
    CHECK(*header(r.messages[1].head, "host") == "b");
  }

  TEST_CASE("inMessage() and headComplete() follow the message") {
    Recorder recorder;
    Parser parser(Parser::Type::Request, &recorder, ParserLimits{});
    CHECK_FALSE(parser.inMessage());
    const std::string head = "POST / HTTP/1.1\r\nContent-Length: 4\r\n";
    CHECK(parser.execute(head.data(), head.size()).status == Parser::Status::NeedMore);
    CHECK(parser.inMessage());
    CHECK_FALSE(parser.headComplete());
    const std::string rest = "\r\nab";
    CHECK(parser.execute(rest.data(), rest.size()).status == Parser::Status::NeedMore);
    CHECK(parser.inMessage());
    CHECK(parser.headComplete());
    const Parser::Result r = parser.execute("cd", 2);
    CHECK(r.status == Parser::Status::MessageDone);
    CHECK(r.consumed == 2);
    CHECK_FALSE(parser.inMessage());
  }

  TEST_CASE("Upgrade: websocket ends at the head; the rest is the tunnel's") {
    const std::string head =
        "GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n";
    const std::string input = head + std::string("\x81\x05hello", 7);
    const Run r = request(input);
    INFO(describe(r));
    CHECK(r.last == Parser::Status::Upgrade);
    CHECK(r.upgrade_at == head.size());
    REQUIRE(r.messages.size() == 1);
    CHECK(r.messages[0].head.upgrade);
    CHECK(r.messages[0].complete);
    CHECK(r.messages[0].body.empty());
    CHECK(r.done_at.empty());
  }

  TEST_CASE("Upgrade without Connection: upgrade is an ordinary request") {
    const std::string input = "GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n";
    const Run r = request(input);
    INFO(describe(r));
    REQUIRE(r.messages.size() == 1);
    CHECK_FALSE(r.messages[0].head.upgrade);
    CHECK(r.last == Parser::Status::MessageDone);
    REQUIRE(r.done_at.size() == 1);
    CHECK(r.done_at[0] == input.size());
  }

  TEST_CASE("keep-alive: HTTP/1.0 closes unless asked, HTTP/1.1 stays unless told") {
    struct Case {
      const char* input;
      int minor;
      bool keep_alive;
    };
    const Case cases[] = {
        {"GET / HTTP/1.0\r\nHost: h\r\n\r\n", 0, false},
        {"GET / HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n", 0, true},
        {"GET / HTTP/1.1\r\nHost: h\r\n\r\n", 1, true},
        {"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", 1, false},
        // RFC 9112 6.1: HTTP/1.0 with Transfer-Encoding closes after it, whatever it asks.
        {"POST / HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n"
         "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         0, false},
        {"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 1, true},
    };
    for (const Case& c : cases) {
      INFO(std::string(c.input));
      const Run r = request(c.input);
      REQUIRE(r.messages.size() == 1);
      CHECK(r.messages[0].head.version_major == 1);
      CHECK(r.messages[0].head.version_minor == c.minor);
      CHECK(r.messages[0].head.isHttp10() == (c.minor == 0));
      CHECK(r.messages[0].head.keep_alive == c.keep_alive);
    }
  }

  TEST_CASE("a head within the caps parses") {
    Options options;
    options.limits.max_head_bytes = 200;
    options.limits.max_header_count = 3;
    const Run r = request("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", options);
    INFO(describe(r));
    CHECK(r.last == Parser::Status::MessageDone);
    REQUIRE(r.messages.size() == 1);
    CHECK(r.messages[0].head.headers.size() == 3);
  }
}

TEST_SUITE("http parser: request errors") {
  TEST_CASE("a header section over max_head_bytes is 431") {
    Options options;
    options.limits.max_head_bytes = 256;
    SUBCASE("one long value") {
      const Run r = request(
          "GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + std::string(300, 'a') + "\r\n\r\n", options);
      checkError(r, 431);
      CHECK(r.messages.empty());
    }
    SUBCASE("many small fields") {
      std::string input = "GET / HTTP/1.1\r\n";
      for (int i = 0; i < 40; ++i) input += "X-F" + std::to_string(i) + ": v\r\n";
      input += "\r\n";
      const Run r = request(input, options);
      checkError(r, 431);
      CHECK(r.messages.empty());
    }
    SUBCASE("a long target") {
      const Run r = request("GET /" + std::string(400, 'x') + " HTTP/1.1\r\n\r\n", options);
      checkError(r, 431);
    }
    SUBCASE("a head that never ends is refused as soon as it is over the cap") {
      // No final CRLF: the parser must not wait for the end of the head to refuse it.
      const Run r = request("GET / HTTP/1.1\r\nX-Big: " + std::string(300, 'a'), options);
      checkError(r, 431);
    }
  }

  TEST_CASE("more header fields than max_header_count is 431") {
    Options options;
    options.limits.max_header_count = 3;
    const Run r = request("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", options);
    checkError(r, 431);
    CHECK(r.messages.empty());
  }

  TEST_CASE("a Content-Length over max_body_bytes is 413 at the head") {
    Options options;
    options.limits.max_body_bytes = 10;
    // Only the head is sent: the refusal must not wait for the body.
    const Run r = request("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n", options);
    checkError(r, 413);
    CHECK(r.messages.empty());
  }

  TEST_CASE("a body exactly at max_body_bytes is accepted") {
    Options options;
    options.limits.max_body_bytes = 10;
    SUBCASE("Content-Length") {
      const Run r = request("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789", options);
      INFO(describe(r));
      CHECK(r.last == Parser::Status::MessageDone);
      REQUIRE(r.messages.size() == 1);
      CHECK(r.messages[0].body == "0123456789");
    }
    SUBCASE("chunked") {
      const Run r = request(
          "POST / HTTP/1.1\r\nTransfer-Encoding: "
          "chunked\r\n\r\n5\r\n01234\r\n5\r\n56789\r\n0\r\n\r\n",
          options);
      INFO(describe(r));
      CHECK(r.last == Parser::Status::MessageDone);
      REQUIRE(r.messages.size() == 1);
      CHECK(r.messages[0].body == "0123456789");
    }
  }

  TEST_CASE("a chunked body over max_body_bytes is 413") {
    Options options;
    options.limits.max_body_bytes = 10;
    SUBCASE("one big chunk") {
      const Run r = request(
          "POST / HTTP/1.1\r\nTransfer-Encoding: "
          "chunked\r\n\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n",
          options);
      checkError(r, 413);
    }
    SUBCASE("small chunks adding up") {
      const Run r = request(
          "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
          "6\r\n012345\r\n6\r\n6789ab\r\n0\r\n\r\n",
          options);
      checkError(r, 413);
    }
    SUBCASE("the cap holds per message, not per connection") {
      const Run r = request(
          "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n0\r\n\r\n"
          "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n0\r\n\r\n",
          options);
      INFO(describe(r));
      CHECK(r.last == Parser::Status::MessageDone);
      CHECK(r.done_at.size() == 2);
    }
  }

  TEST_CASE("framing that request smuggling relies on is 400") {
    SUBCASE("Content-Length with Transfer-Encoding") {
      checkError(request("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                 400);
    }
    SUBCASE("Transfer-Encoding with Content-Length") {
      checkError(request("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
                         "Content-Length: 5\r\n\r\n0\r\n\r\n"),
                 400);
    }
    SUBCASE("two Content-Length fields") {
      checkError(request("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"),
                 400);
    }
    SUBCASE("two identical Content-Length fields") {
      checkError(request("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"),
                 400);
    }
    SUBCASE("a Content-Length that is not a number") {
      checkError(request("POST / HTTP/1.1\r\nContent-Length: 3x\r\n\r\nabc"), 400);
      checkError(request("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
    }
    SUBCASE("a field without a name") {
      checkError(request("POST / HTTP/1.1\r\nHost: h\r\n: Transfer-Encoding: chunked\r\n"
                         "Content-Length: 1\r\n\r\na"),
                 400);
      checkError(request("GET / HTTP/1.1\r\n:\r\nHost: h\r\n\r\n"), 400);
      checkError(request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "1\r\na\r\n0\r\n: t\r\n\r\n"),
                 400);
    }
    SUBCASE("a chunk size that would wrap the body count past the cap") {
      Options options;
      options.limits.max_body_bytes = 10;
      checkError(request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "5\r\nhello\r\nfffffffffffffffd\r\nab",
                         options),
                 413);
    }
    SUBCASE("chunked that is not the final coding") {
      checkError(request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n"),
                 400);
    }
    SUBCASE("a bad chunk size") {
      checkError(
          request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"),
          400);
    }
    SUBCASE("chunk data longer than its size") {
      checkError(
          request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n"),
          400);
    }
  }

  TEST_CASE("malformed heads are 400") {
    SUBCASE("a header name with a space") {
      checkError(request("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"), 400);
    }
    SUBCASE("whitespace between the name and the colon") {
      checkError(request("GET / HTTP/1.1\r\nHost : h\r\n\r\n"), 400);
    }
    SUBCASE("a header line without a colon") {
      checkError(request("GET / HTTP/1.1\r\nNoColon\r\n\r\n"), 400);
    }
    SUBCASE("a NUL byte in a header value") {
      checkError(request("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n"sv), 400);
    }
    SUBCASE("a NUL byte in the target") {
      checkError(request("GET /a\0b HTTP/1.1\r\n\r\n"sv), 400);
    }
    SUBCASE("obs-fold: a header line that starts with a space") {
      checkError(request("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n  folded\r\n\r\n"), 400);
    }
    SUBCASE("obs-fold: a header line that starts with a tab") {
      checkError(request("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n\tfolded\r\n\r\n"), 400);
    }
    SUBCASE("a space before the first header field") {
      checkError(request("GET / HTTP/1.1\r\n Host: h\r\n\r\n"), 400);
    }
    SUBCASE("bare LF line endings everywhere") {
      checkError(request("GET / HTTP/1.1\nHost: h\n\n"), 400);
    }
    SUBCASE("bare LF after the request line") {
      checkError(request("GET / HTTP/1.1\nHost: h\r\n\r\n"), 400);
    }
    SUBCASE("bare LF after a header field") {
      checkError(request("GET / HTTP/1.1\r\nHost: h\nX-A: b\r\n\r\n"), 400);
    }
    SUBCASE("bare LF ending the head") {
      checkError(request("GET / HTTP/1.1\r\nHost: h\r\n\n"), 400);
    }
    SUBCASE("bare LF after a chunk size") {
      checkError(
          request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n"), 400);
    }
    SUBCASE("bare LF after the last chunk") {
      checkError(
          request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\n"), 400);
    }
    SUBCASE("an unknown HTTP version") {
      checkError(request("GET / HTTP/3.7\r\nHost: h\r\n\r\n"), 400);
    }
    SUBCASE("garbage instead of a request line") {
      checkError(request("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"sv), 400);
    }
  }

  TEST_CASE("onMessageHead returning a status stops with that status") {
    Options options;
    options.head_status = 405;
    const std::string input =
        "DELETE /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n\r\n";
    const Run r = request(input, options);
    checkError(r, 405);
    REQUIRE(r.messages.size() == 1);  // the head was reported, then refused
    CHECK(r.messages[0].head.method == "DELETE");
    CHECK(r.messages[0].body.empty());
    CHECK_FALSE(r.messages[0].complete);
    CHECK(r.done_at.empty());
  }

  TEST_CASE("finish(): idle is fine, a request cut short is 400") {
    Options options;
    options.finish = true;
    SUBCASE("nothing received") {
      const Run r = request("", options);
      REQUIRE(r.finish_status.has_value());
      CHECK(*r.finish_status == Parser::Status::NeedMore);
    }
    SUBCASE("after a complete request") {
      const Run r = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n", options);
      REQUIRE(r.finish_status.has_value());
      CHECK(*r.finish_status == Parser::Status::NeedMore);
      CHECK(r.done_at.size() == 1);
    }
    SUBCASE("in the middle of the head") {
      const Run r = request("GET / HTTP/1.1\r\nHost: h\r\n", options);
      REQUIRE(r.finish_status.has_value());
      CHECK(*r.finish_status == Parser::Status::Error);
      CHECK(r.finish_error_status == 400);
    }
    SUBCASE("in the middle of the body") {
      const Run r = request("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", options);
      REQUIRE(r.finish_status.has_value());
      CHECK(*r.finish_status == Parser::Status::Error);
      CHECK(r.finish_error_status == 400);
    }
  }
}

TEST_SUITE("http parser: responses") {
  TEST_CASE("status, reason, headers and a Content-Length body") {
    const std::string input =
        "HTTP/1.1 404 Not Found Here\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello";
    const Run r = response(input);
    INFO(describe(r));
    REQUIRE(r.messages.size() == 1);
    const MessageHead& h = r.messages[0].head;
    CHECK(h.status == 404);
    CHECK(h.reason == "Not Found Here");
    CHECK(h.version_minor == 1);
    REQUIRE(header(h, "content-type") != nullptr);
    CHECK(*header(h, "content-type") == "text/plain");
    REQUIRE(h.content_length.has_value());
    CHECK(*h.content_length == 5);
    CHECK(r.messages[0].body == "hello");
    REQUIRE(r.done_at.size() == 1);
    CHECK(r.done_at[0] == input.size());
  }

  TEST_CASE("a chunked response body") {
    const std::string input =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n1\r\nd\r\n0\r\n\r\n";
    const Run r = response(input);
    REQUIRE(r.messages.size() == 1);
    CHECK(r.messages[0].head.chunked);
    CHECK(r.messages[0].body == "abcd");
    REQUIRE(r.done_at.size() == 1);
    CHECK(r.done_at[0] == input.size());
  }

  TEST_CASE("interim 1xx responses are swallowed; the final response is reported") {
    const std::string interim =
        "HTTP/1.1 100 Continue\r\n\r\n"
        "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n";
    const std::string final_response =
        "HTTP/1.1 201 Created\r\nLocation: /x\r\nContent-Length: 2\r\n\r\nok";
    const std::string input = interim + final_response;

    SUBCASE("in one run") {
      const Run r = response(input);
      INFO(describe(r));
      REQUIRE(r.messages.size() == 1);
      CHECK(r.messages[0].head.status == 201);
      CHECK(r.messages[0].head.reason == "Created");
      CHECK(header(r.messages[0].head, "link") == nullptr);
      REQUIRE(header(r.messages[0].head, "location") != nullptr);
      CHECK(r.messages[0].body == "ok");
      REQUIRE(r.done_at.size() == 1);  // no MessageDone for the interim responses
      CHECK(r.done_at[0] == input.size());
    }
    SUBCASE("the interim responses alone report nothing and leave the parser in a message") {
      Recorder recorder;
      Parser parser(Parser::Type::Response, &recorder, ParserLimits{});
      const Parser::Result res = parser.execute(interim.data(), interim.size());
      CHECK(res.status == Parser::Status::NeedMore);
      CHECK(res.consumed == interim.size());
      CHECK(recorder.messages.empty());
      CHECK(parser.inMessage());
    }
  }

  TEST_CASE("setExpectNoBody (HEAD): no body whatever Content-Length says") {
    Options options;
    options.expect_no_body = true;
    const std::string first = "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n";
    const std::string second = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    const Run r = response(first + second, options);
    INFO(describe(r));
    REQUIRE(r.messages.size() == 2);
    REQUIRE(r.messages[0].head.content_length.has_value());
    CHECK(*r.messages[0].head.content_length == 1234);  // still reported for the client
    CHECK(r.messages[0].body.empty());
    CHECK(r.messages[1].body.empty());
    REQUIRE(r.done_at.size() == 2);
    CHECK(r.done_at[0] == first.size());
    CHECK(r.done_at[1] == first.size() + second.size());
  }

  TEST_CASE("204 and 304 have no body") {
    const std::string next = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz";
    SUBCASE("204 No Content") {
      const std::string first = "HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n";
      const Run r = response(first + next);
      INFO(describe(r));
      REQUIRE(r.messages.size() == 2);
      CHECK(r.messages[0].head.status == 204);
      CHECK(r.messages[0].body.empty());
      REQUIRE(r.done_at.size() == 2);
      CHECK(r.done_at[0] == first.size());
      CHECK(r.messages[1].body == "z");
    }
    SUBCASE("304 Not Modified") {
      const std::string first = "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n";
      const Run r = response(first + next);
      INFO(describe(r));
      REQUIRE(r.messages.size() == 2);
      CHECK(r.messages[0].head.status == 304);
      CHECK(r.messages[0].body.empty());
      REQUIRE(r.done_at.size() == 2);
      CHECK(r.done_at[0] == first.size());
      CHECK(r.messages[1].body == "z");
    }
    SUBCASE("304 with the Content-Length of the representation (RFC 9110 8.6)") {
      // A 304 never has a body (RFC 9112 6.3 rule 1), whatever Content-Length says.
      const std::string first =
          "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nContent-Length: 20\r\n\r\n";
      const Run r = response(first + next);
      INFO(describe(r));
      REQUIRE(r.messages.size() == 2);
      CHECK(r.messages[0].body.empty());
      REQUIRE(r.done_at.size() == 2);
      CHECK(r.done_at[0] == first.size());
      CHECK(r.messages[1].head.status == 200);
      CHECK(r.messages[1].body == "z");
    }
  }

  TEST_CASE("a close-delimited body is completed by finish()") {
    Options options;
    options.finish = true;
    const Run r = response("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nabcdef", options);
    INFO(describe(r));
    REQUIRE(r.messages.size() == 1);
    CHECK_FALSE(r.messages[0].head.keep_alive);
    CHECK_FALSE(r.messages[0].head.content_length.has_value());
    CHECK_FALSE(r.messages[0].head.chunked);
    CHECK(r.last == Parser::Status::NeedMore);
    REQUIRE(r.finish_status.has_value());
    CHECK(*r.finish_status == Parser::Status::MessageDone);
    CHECK(r.messages[0].body == "abcdef");
    CHECK(r.messages[0].complete);
  }

  TEST_CASE("finish() in the middle of a Content-Length body is an error") {
    Options options;
    options.finish = true;
    const Run r = response("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", options);
    INFO(describe(r));
    REQUIRE(r.finish_status.has_value());
    CHECK(*r.finish_status == Parser::Status::Error);
    CHECK(r.finish_error_status == 502);
    REQUIRE(r.messages.size() == 1);
    CHECK_FALSE(r.messages[0].complete);
  }

  TEST_CASE("finish() in the middle of a chunked body is an error") {
    Options options;
    options.finish = true;
    const Run r = response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", options);
    REQUIRE(r.finish_status.has_value());
    CHECK(*r.finish_status == Parser::Status::Error);
    CHECK(r.finish_error_status == 502);
  }

  TEST_CASE("101 Switching Protocols ends at its head") {
    const std::string head =
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    const Run r = response(head + "tunnel bytes");
    INFO(describe(r));
    CHECK(r.last == Parser::Status::Upgrade);
    CHECK(r.upgrade_at == head.size());
    REQUIRE(r.messages.size() == 1);
    CHECK(r.messages[0].head.status == 101);
    CHECK(r.messages[0].head.upgrade);
  }

  TEST_CASE("malformed or oversized responses are 502") {
    SUBCASE("two Content-Length fields") {
      checkError(response("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
                 502);
    }
    SUBCASE("a bad status line") { checkError(response("HTTP/1.1 abc OK\r\n\r\n"), 502); }
    SUBCASE("a head over the cap") {
      Options options;
      options.limits.max_head_bytes = 64;
      checkError(
          response("HTTP/1.1 200 OK\r\nX-Big: " + std::string(100, 'b') + "\r\n\r\n", options),
          502);
    }
    SUBCASE("too many header fields") {
      Options options;
      options.limits.max_header_count = 2;
      checkError(response("HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", options), 502);
    }
  }
}
