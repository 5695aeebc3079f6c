// Header rules at the proxy boundary (src/http/forwarding.h), the header helpers
// (src/http/headers.h) and the responses Sluice writes itself (src/http/responses.h).

#include <doctest/doctest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "http/forwarding.h"
#include "http/headers.h"
#include "http/responses.h"

using namespace sluice::http;

namespace {

struct Serialized {
  std::string start_line;
  std::vector<Header> fields;
  std::string body;
  bool terminated = false;  // the head ended with an empty line
};

// Splits a serialized head ("start\r\nName: value\r\n...\r\n\r\nbody").
Serialized split(std::string_view text) {
  Serialized out;
  const auto end = text.find("\r\n\r\n");
  if (end != std::string_view::npos) {
    out.terminated = true;
    out.body = std::string(text.substr(end + 4));
    text = text.substr(0, end + 2);
  }
  bool first = true;
  while (!text.empty()) {
    const auto eol = text.find("\r\n");
    const std::string_view line = text.substr(0, eol);
    if (first) {
      out.start_line = std::string(line);
      first = false;
    } else {
      const auto colon = line.find(':');
      Header h;
      h.name = std::string(line.substr(0, colon));
      if (colon != std::string_view::npos) h.value = std::string(trim(line.substr(colon + 1)));
      out.fields.push_back(h);
    }
    if (eol == std::string_view::npos) break;
    text.remove_prefix(eol + 2);
  }
  return out;
}

// Every value of a field, rendered as ["a", "b"] (and [] when absent) so that failures print.
std::string render(const std::vector<std::string>& list) {
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) out += (i ? ", \"" : "\"") + list[i] + "\"";
  return out + "]";
}

std::string values(const Serialized& s, std::string_view name) {
  std::vector<std::string> out;
  for (const Header& h : s.fields) {
    if (iequals(h.name, name)) out.push_back(h.value);
  }
  return render(out);
}

std::string one(const std::string& value) { return render({value}); }
const std::string kNone = "[]";

MessageHead requestHead(std::vector<Header> fields, int minor = 1) {
  MessageHead h;
  h.method = "POST";
  h.target = "/raw/../target?x";
  h.version_minor = minor;
  for (auto& f : fields) h.headers.add(f.name, f.value);
  return h;
}

MessageHead responseHead(int status, std::vector<Header> fields, int minor = 1) {
  MessageHead h;
  h.status = status;
  h.version_minor = minor;
  for (auto& f : fields) h.headers.add(f.name, f.value);
  return h;
}

UpstreamRequestContext upstreamContext() {
  UpstreamRequestContext c;
  c.target = "/target?x";
  c.forwarded_for = "203.0.113.7";
  c.scheme = "http";
  return c;
}

}  // namespace

TEST_SUITE("http headers") {
  TEST_CASE("iequals, toLower and trim") {
    CHECK(iequals("Content-Length", "content-LENGTH"));
    CHECK(iequals("", ""));
    CHECK_FALSE(iequals("Host", "Hosts"));
    CHECK_FALSE(iequals("a-b", "a_b"));
    CHECK_FALSE(iequals("[", "{"));  // 0x5b and 0x7b differ by 32 but are not letters
    CHECK_FALSE(iequals("@", "`"));
    CHECK(toLower("X-API-Key 42") == "x-api-key 42");
    CHECK(trim(" \t a b \t ") == "a b");
    CHECK(trim("   ") == "");
    CHECK(trim("") == "");
    CHECK(trim("\ra\n") == "\ra\n");  // only spaces and tabs
  }

  TEST_CASE("parseContentLength: digits only, at most 19") {
    CHECK(parseContentLength("0") == uint64_t{0});
    CHECK(parseContentLength("1048576") == uint64_t{1048576});
    CHECK(parseContentLength("9223372036854775807") == uint64_t{9223372036854775807ull});
    for (std::string_view bad : {"", "-1", "+1", " 1", "1 ", "1a", "12345678901234567890"}) {
      CHECK_FALSE(parseContentLength(bad));
    }
  }

  TEST_CASE("forEachListElement trims and skips empty elements") {
    std::vector<std::string> seen;
    forEachListElement(" a, b ,,\tc , ,", [&](std::string_view e) { seen.emplace_back(e); });
    CHECK(seen == std::vector<std::string>{"a", "b", "c"});
    seen.clear();
    forEachListElement("", [&](std::string_view e) { seen.emplace_back(e); });
    forEachListElement(" , ,", [&](std::string_view e) { seen.emplace_back(e); });
    CHECK(seen.empty());
    forEachListElement("single", [&](std::string_view e) { seen.emplace_back(e); });
    CHECK(seen == std::vector<std::string>{"single"});
  }

  TEST_CASE("HeaderMap: ordered, case-insensitive lookups, join, remove, set") {
    HeaderMap m;
    m.add("Accept", "text/html");
    m.add("X-Token", "a");
    m.add("accept", "application/json");
    m.add("ACCEPT", "");
    CHECK(m.size() == 4);
    REQUIRE(m.get("ACCEPT") != nullptr);
    CHECK(*m.get("ACCEPT") == "text/html");
    CHECK(m.get("missing") == nullptr);
    CHECK(m.count("accept") == 3);
    CHECK(m.count("missing") == 0);
    CHECK(m.getJoined("Accept") == std::optional<std::string>("text/html, application/json, "));
    CHECK(m.getJoined("x-token") == std::optional<std::string>("a"));
    CHECK_FALSE(m.getJoined("missing").has_value());
    CHECK(m.fields()[2].name == "accept");  // names keep their case

    CHECK(m.remove("Accept") == 3);
    CHECK(m.size() == 1);
    CHECK(m.remove("Accept") == 0);

    m.add("Via", "1");
    m.add("X-Last", "z");
    m.add("via", "2");
    m.set("VIA", "3");
    CHECK(m.count("via") == 1);
    REQUIRE(m.get("via") != nullptr);
    CHECK(*m.get("via") == "3");
    CHECK(m.fields().back().name == "VIA");
    CHECK(m.fields().back().value == "3");
    CHECK(m.fields()[0].name == "X-Token");
    CHECK(m.fields()[1].name == "X-Last");
    m.clear();
    CHECK(m.empty());
  }

  TEST_CASE("HeaderMap::replace: the first keeps its place and name, the others go") {
    HeaderMap m;
    m.add("A", "1");
    m.add("host", "x");
    m.add("B", "2");
    m.add("Host", "y");
    m.replace("Host", "z");
    REQUIRE(m.size() == 3);
    CHECK(m.fields()[1].name == "host");
    CHECK(m.fields()[1].value == "z");
    HeaderMap empty;
    empty.add("A", "1");
    empty.replace("Host", "h");
    CHECK(empty.fields()[0].name == "Host");
    CHECK(validAuthority("example.com:80"));
    CHECK(validAuthority("[::1]:80"));
    CHECK_FALSE(validAuthority("a b"));
    CHECK_FALSE(validAuthority("a\"b"));
    CHECK_FALSE(validAuthority("a/b"));
  }
}

TEST_SUITE("http forwarding: hop-by-hop") {
  TEST_CASE("isHopByHop") {
    for (const char* name : {"Connection", "keep-alive", "TE", "transfer-encoding", "UPGRADE",
                             "Proxy-Authorization", "proxy-connection", "Proxy-Authenticate"}) {
      INFO(std::string(name));
      CHECK(isHopByHop(name));
    }
    // Trailer announces the trailer fields, which go on with it (RFC 9110 6.6.2).
    for (const char* name : {"Host", "Content-Length", "X-Proxy-Id", "Trailers-X", "Via",
                             "X-Forwarded-For", "Connections", "Proxy", "Trailer"}) {
      INFO(std::string(name));
      CHECK_FALSE(isHopByHop(name));
    }
  }

  TEST_CASE("trailers: the fields a proxy controls in a head never go on in a trailer section") {
    for (const char* name :
         {"grpc-status", "Grpc-Message", "X-Checksum", "Server-Timing", "Digest", "Trailers-X"}) {
      INFO(std::string(name));
      CHECK(forwardableTrailer(name));
    }
    for (const char* name : {"Content-Length", "Transfer-Encoding", "Host", "Connection",
                             "Keep-Alive", "TE", "Trailer", "Upgrade", "Proxy-Authorization", "Via",
                             "X-Forwarded-For", "x-forwarded-proto", "X-Forwarded-Host",
                             "Forwarded", "X-Real-IP", "Expect", ":status", ""}) {
      INFO(std::string(name));
      CHECK_FALSE(forwardableTrailer(name));
    }
    HeaderMap t;
    t.add("X-Checksum", "abc");
    t.add("Content-Length", "5");
    t.add("X-Forwarded-For", "198.51.100.1");
    t.add("Grpc-Status", "0");
    CHECK(lastChunk(t) == "0\r\nX-Checksum: abc\r\nGrpc-Status: 0\r\n\r\n");
    CHECK(lastChunk(HeaderMap{}) == kLastChunk);
    const std::vector<Header> fields = trailerFields(t);
    REQUIRE(fields.size() == 2);
    CHECK(fields[0].name == "x-checksum");
    CHECK(fields[1].name == "grpc-status");
    CHECK(fields[1].value == "0");
  }

  TEST_CASE("connectionOptions lists every Connection field, lower case, never Host or framing") {
    HeaderMap m;
    m.add("Connection", "Keep-Alive, X-Hop-One");
    m.add("X-Other", "a, b");
    m.add("connection", " x-hop-TWO ,Host, content-length, Transfer-Encoding,,");
    CHECK(connectionOptions(m) == std::vector<std::string>{"keep-alive", "x-hop-one", "x-hop-two"});
    CHECK(connectionOptions(HeaderMap{}).empty());
  }
}

TEST_SUITE("http forwarding: upstream request head") {
  TEST_CASE("request line: the given target, HTTP/1.1, head ends with an empty line") {
    const MessageHead req = requestHead({{"Host", "example.com"}}, 0);
    const std::string out = buildUpstreamRequestHead(req, upstreamContext());
    const Serialized s = split(out);
    CHECK(s.start_line == "POST /target?x HTTP/1.1");
    CHECK(s.terminated);
    CHECK(s.body.empty());
    CHECK(out.size() >= 4);
    CHECK(out.substr(out.size() - 4) == "\r\n\r\n");
  }

  TEST_CASE("hop-by-hop fields and those that Connection names are removed") {
    const MessageHead req = requestHead({
        {"Host", "example.com"},
        {"Connection", "keep-alive, X-Custom-Hop, x-lower-hop"},
        {"Connection", "X-Second-Connection"},
        {"Keep-Alive", "timeout=5"},
        {"TE", "trailers"},
        {"Trailer", "X-Checksum"},
        {"Transfer-Encoding", "chunked"},
        {"Upgrade", "h2c"},
        {"Proxy-Authorization", "Basic eDp5"},
        {"Proxy-Connection", "keep-alive"},
        {"X-Custom-Hop", "1"},
        {"X-LOWER-HOP", "2"},
        {"X-Second-Connection", "3"},
        {"Accept", "*/*"},
        {"X-Keep", "yes"},
    });
    const Serialized s = split(buildUpstreamRequestHead(req, upstreamContext()));
    for (const char* name :
         {"Connection", "Keep-Alive", "TE", "Transfer-Encoding", "Upgrade", "Proxy-Authorization",
          "Proxy-Connection", "X-Custom-Hop", "X-Lower-Hop", "X-Second-Connection"}) {
      INFO(std::string(name));
      CHECK(values(s, name) == kNone);
    }
    CHECK(values(s, "Trailer") == one("X-Checksum"));  // the trailers go on with it
    CHECK(values(s, "Host") == one("example.com"));
    CHECK(values(s, "Accept") == one("*/*"));
    CHECK(values(s, "X-Keep") == one("yes"));
  }

  TEST_CASE("Connection cannot remove Host, Content-Length or Transfer-Encoding framing") {
    MessageHead req = requestHead({{"Host", "example.com"},
                                   {"Connection", "Host, Content-Length, Transfer-Encoding"},
                                   {"Content-Length", "5"}});
    req.content_length = 5;
    UpstreamRequestContext c = upstreamContext();
    c.body = Framing::ContentLength;
    const Serialized s = split(buildUpstreamRequestHead(req, c));
    CHECK(values(s, "Host") == one("example.com"));
    CHECK(values(s, "Content-Length") == one("5"));
  }

  TEST_CASE("forwarded fields keep their order, names and values") {
    const MessageHead req = requestHead(
        {{"Host", "h"}, {"x-b", "2"}, {"Set-Thing", "a"}, {"X-A", "1, 2"}, {"set-thing", "b"}});
    const Serialized s = split(buildUpstreamRequestHead(req, upstreamContext()));
    REQUIRE(s.fields.size() >= 5);
    CHECK(s.fields[0].name == "Host");
    CHECK(s.fields[1].name == "x-b");
    CHECK(s.fields[2].name == "Set-Thing");
    CHECK(s.fields[2].value == "a");
    CHECK(s.fields[3].name == "X-A");
    CHECK(s.fields[3].value == "1, 2");
    CHECK(s.fields[4].name == "set-thing");
    CHECK(s.fields[4].value == "b");
  }

  TEST_CASE("X-Forwarded-For is the given value, whatever the client sent") {
    const MessageHead req = requestHead(
        {{"Host", "h"}, {"X-Forwarded-For", "1.1.1.1"}, {"x-forwarded-for", "2.2.2.2"}});
    UpstreamRequestContext c = upstreamContext();
    c.forwarded_for = "198.51.100.1, 10.0.0.2";
    for (bool trusted : {false, true}) {
      INFO("trusted " << trusted);
      c.trusted_peer = trusted;
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "X-Forwarded-For") == one("198.51.100.1, 10.0.0.2"));
    }
  }

  TEST_CASE("X-Real-IP is the resolved client, never the client's own") {
    const MessageHead req =
        requestHead({{"Host", "h"}, {"X-Real-IP", "6.6.6.6"}, {"x-real-ip", "7.7.7.7"}});
    UpstreamRequestContext c = upstreamContext();
    c.real_ip = "198.51.100.1";
    for (bool trusted : {false, true}) {
      INFO("trusted " << trusted);
      c.trusted_peer = trusted;
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "X-Real-IP") == one("198.51.100.1"));
    }
  }

  TEST_CASE("X-Forwarded-Proto and -Host: overwritten for untrusted peers") {
    const MessageHead req = requestHead({{"Host", "api.example.com"},
                                         {"X-Forwarded-Proto", "https"},
                                         {"X-Forwarded-Host", "evil.example"},
                                         {"x-forwarded-proto", "gopher"}});
    UpstreamRequestContext c = upstreamContext();
    c.scheme = "http";
    c.trusted_peer = false;
    const Serialized s = split(buildUpstreamRequestHead(req, c));
    CHECK(values(s, "X-Forwarded-Proto") == one("http"));
    CHECK(values(s, "X-Forwarded-Host") == one("api.example.com"));
  }

  TEST_CASE("X-Forwarded-Proto and -Host: a trusted peer's are kept, else Sluice's are added") {
    UpstreamRequestContext c = upstreamContext();
    c.scheme = "http";
    c.trusted_peer = true;
    SUBCASE("kept") {
      const MessageHead req = requestHead({{"Host", "internal:8080"},
                                           {"X-Forwarded-Proto", "https"},
                                           {"X-Forwarded-Host", "api.example.com"}});
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "X-Forwarded-Proto") == one("https"));
      CHECK(values(s, "X-Forwarded-Host") == one("api.example.com"));
    }
    SUBCASE("absent: added") {
      const MessageHead req = requestHead({{"Host", "internal:8080"}});
      c.scheme = "https";
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "X-Forwarded-Proto") == one("https"));
      CHECK(values(s, "X-Forwarded-Host") == one("internal:8080"));
    }
    SUBCASE("named by Connection (so hop-by-hop): Sluice still sends its own") {
      const MessageHead req = requestHead({{"Host", "internal:8080"},
                                           {"Connection", "X-Forwarded-Proto, X-Forwarded-Host"},
                                           {"X-Forwarded-Proto", "https"},
                                           {"X-Forwarded-Host", "api.example.com"}});
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "X-Forwarded-Proto") == one("http"));
      CHECK(values(s, "X-Forwarded-Host") == one("internal:8080"));
    }
  }

  TEST_CASE("no Host: no X-Forwarded-Host is invented") {
    const MessageHead req = requestHead({{"X-Forwarded-Host", "evil"}}, 0);
    const Serialized s = split(buildUpstreamRequestHead(req, upstreamContext()));
    CHECK(values(s, "X-Forwarded-Host") == kNone);
  }

  TEST_CASE("no Host (HTTP/1.0): the default host is sent, first; a client's Host is kept") {
    UpstreamRequestContext c = upstreamContext();
    c.default_host = "127.0.0.1:9000";
    SUBCASE("absent: added first, and not as X-Forwarded-Host") {
      const Serialized s =
          split(buildUpstreamRequestHead(requestHead({{"Accept", "*/*"}, {"X-A", "1"}}, 0), c));
      CHECK(s.start_line == "POST /target?x HTTP/1.1");
      REQUIRE(s.fields.size() >= 3);
      CHECK(s.fields[0].name == "Host");
      CHECK(s.fields[0].value == "127.0.0.1:9000");
      CHECK(s.fields[1].name == "Accept");
      CHECK(values(s, "Host") == one("127.0.0.1:9000"));
      CHECK(values(s, "X-Forwarded-Host") == kNone);
      CHECK(s.terminated);
    }
    SUBCASE("no fields at all") {
      const Serialized s = split(buildUpstreamRequestHead(requestHead({}, 0), c));
      REQUIRE_FALSE(s.fields.empty());
      CHECK(s.fields[0].name == "Host");
      CHECK(values(s, "Host") == one("127.0.0.1:9000"));
    }
    SUBCASE("present: passed unchanged") {
      const Serialized s =
          split(buildUpstreamRequestHead(requestHead({{"hOsT", "Front.Example:8443"}}, 0), c));
      CHECK(s.fields[0].name == "hOsT");
      CHECK(values(s, "Host") == one("Front.Example:8443"));
      CHECK(values(s, "X-Forwarded-Host") == one("Front.Example:8443"));
    }
  }

  TEST_CASE("upstreamAuthority: as nginx's $proxy_host, port only when not the default") {
    CHECK(upstreamAuthority("127.0.0.1", 9000, false) == "127.0.0.1:9000");
    CHECK(upstreamAuthority("127.0.0.1", 80, false) == "127.0.0.1");
    CHECK(upstreamAuthority("127.0.0.1", 443, false) == "127.0.0.1:443");
    CHECK(upstreamAuthority("api.internal", 443, true) == "api.internal");
    CHECK(upstreamAuthority("api.internal", 80, true) == "api.internal:80");
    CHECK(upstreamAuthority("Api.Internal", 8443, true) == "Api.Internal:8443");
    CHECK(upstreamAuthority("::1", 9000, false) == "[::1]:9000");
    CHECK(upstreamAuthority("2001:db8::7", 80, false) == "[2001:db8::7]");
    CHECK(upstreamAuthority("2001:db8::7", 443, true) == "[2001:db8::7]");
  }

  TEST_CASE("Via is appended with the client's version") {
    SUBCASE("HTTP/1.1 client, no Via") {
      const Serialized s =
          split(buildUpstreamRequestHead(requestHead({{"Host", "h"}}, 1), upstreamContext()));
      CHECK(values(s, "Via") == one("1.1 sluice"));
    }
    SUBCASE("HTTP/1.0 client, two Via fields") {
      const MessageHead req =
          requestHead({{"Host", "h"}, {"Via", "1.1 cdn-a"}, {"via", "1.1 cdn-b"}}, 0);
      const Serialized s = split(buildUpstreamRequestHead(req, upstreamContext()));
      CHECK(values(s, "Via") == one("1.1 cdn-a, 1.1 cdn-b, 1.0 sluice"));
    }
  }

  TEST_CASE("Expect is removed") {
    const MessageHead req = requestHead({{"Host", "h"}, {"Expect", "100-continue"}});
    const Serialized s = split(buildUpstreamRequestHead(req, upstreamContext()));
    CHECK(values(s, "Expect") == kNone);
  }

  TEST_CASE("body framing upstream") {
    MessageHead req =
        requestHead({{"Host", "h"}, {"Content-Length", "999"}, {"Transfer-Encoding", "chunked"}});
    req.content_length = 42;
    UpstreamRequestContext c = upstreamContext();
    SUBCASE("Content-Length: the message's, once") {
      c.body = Framing::ContentLength;
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "Content-Length") == one("42"));
      CHECK(values(s, "Transfer-Encoding") == kNone);
    }
    SUBCASE("chunked") {
      c.body = Framing::Chunked;
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "Transfer-Encoding") == one("chunked"));
      CHECK(values(s, "Content-Length") == kNone);
    }
    SUBCASE("chunked keeps the codings before it, in order") {
      c.body = Framing::Chunked;
      const MessageHead coded = requestHead(
          {{"Host", "h"}, {"Transfer-Encoding", "gzip"}, {"transfer-encoding", "br, chunked"}});
      const Serialized s = split(buildUpstreamRequestHead(coded, c));
      CHECK(values(s, "Transfer-Encoding") == one("gzip, br, chunked"));
    }
    SUBCASE("no body") {
      c.body = Framing::None;
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "Transfer-Encoding") == kNone);
      CHECK(values(s, "Content-Length") == kNone);
    }
  }

  TEST_CASE("tunnels keep Upgrade and send Connection: upgrade; others send no Connection") {
    const MessageHead req = requestHead({{"Host", "h"},
                                         {"Connection", "Upgrade, X-Hop"},
                                         {"Upgrade", "websocket"},
                                         {"X-Hop", "1"},
                                         {"Sec-WebSocket-Key", "k"}});
    UpstreamRequestContext c = upstreamContext();
    SUBCASE("tunnel") {
      c.tunnel = true;
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "Upgrade") == one("websocket"));
      CHECK(values(s, "Connection") == one("upgrade"));
      CHECK(values(s, "X-Hop") == kNone);
      CHECK(values(s, "Sec-WebSocket-Key") == one("k"));
    }
    SUBCASE("not a tunnel") {
      c.tunnel = false;
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "Upgrade") == kNone);
      CHECK(values(s, "Connection") == kNone);
    }
  }
}

TEST_SUITE("http forwarding: upstream request fields (HTTP/2)") {
  // The fields as a Serialized head, to ask them as the HTTP/1.1 tests do.
  Serialized asHead(const std::vector<Header>& fields) {
    Serialized s;
    s.fields = fields;
    return s;
  }

  TEST_CASE("pseudo-fields first, Host as :authority, the HTTP/1.1 head's other fields") {
    auto head = requestHead({{"Host", "api.example"},
                             {"Content-Type", "application/grpc"},
                             {"X-Forwarded-For", "1.2.3.4"},
                             {"X-Custom", "a"}});
    head.content_length = 5;
    auto context = upstreamContext();
    context.body = Framing::ContentLength;
    const std::vector<Header> fields = upstreamRequestFields(head, context, "https");
    REQUIRE(fields.size() >= 4);
    CHECK(fields[0].name == ":method");
    CHECK(fields[0].value == "POST");
    CHECK(fields[1].name == ":scheme");
    CHECK(fields[1].value == "https");
    CHECK(fields[2].name == ":authority");
    CHECK(fields[2].value == "api.example");
    CHECK(fields[3].name == ":path");
    CHECK(fields[3].value == "/target?x");
    const Serialized s = asHead(fields);
    CHECK(values(s, "host") == kNone);
    CHECK(values(s, "content-type") == one("application/grpc"));
    CHECK(values(s, "x-custom") == one("a"));
    CHECK(values(s, "x-forwarded-for") == one("203.0.113.7"));  // the context's, as HTTP/1.1
    CHECK(values(s, "x-forwarded-host") == one("api.example"));
    CHECK(values(s, "content-length") == one("5"));
    CHECK(values(s, "via") == one("1.1 sluice"));
    for (size_t i = 4; i < fields.size(); ++i) {
      CHECK(fields[i].name == toLower(fields[i].name));
      CHECK(fields[i].name[0] != ':');
    }
  }

  TEST_CASE("no connection-specific field: a body of unknown length has no Transfer-Encoding") {
    auto head = requestHead({{"Host", "h"},
                             {"Connection", "keep-alive, x-drop"},
                             {"Keep-Alive", "timeout=5"},
                             {"X-Drop", "1"},
                             {"Transfer-Encoding", "chunked"},
                             {"Upgrade", "websocket"},
                             {"Proxy-Connection", "keep-alive"}});
    head.chunked = true;
    auto context = upstreamContext();
    context.body = Framing::Chunked;
    context.tunnel = true;  // never on HTTP/2
    const Serialized s = asHead(upstreamRequestFields(head, context, "http"));
    for (const char* name : {"connection", "keep-alive", "x-drop", "transfer-encoding", "upgrade",
                             "proxy-connection", "te"}) {
      CHECK_MESSAGE(values(s, name) == kNone, name);
    }
  }

  TEST_CASE("TE goes as trailers when the client named it, never anything else") {
    auto with = requestHead({{"Host", "h"}, {"TE", "gzip, trailers"}});
    CHECK(values(asHead(upstreamRequestFields(with, upstreamContext(), "http")), "te") ==
          one("trailers"));
    auto without = requestHead({{"Host", "h"}, {"TE", "gzip"}});
    CHECK(values(asHead(upstreamRequestFields(without, upstreamContext(), "http")), "te") == kNone);
  }

  TEST_CASE("an HTTP/1.0 request without Host: the endpoint's authority") {
    auto head = requestHead({}, 0);
    auto context = upstreamContext();
    context.default_host = "127.0.0.1:9000";
    const std::vector<Header> fields = upstreamRequestFields(head, context, "http");
    CHECK(fields[2].value == "127.0.0.1:9000");
    CHECK(values(asHead(fields), "host") == kNone);
  }
}

TEST_SUITE("http forwarding: Forwarded and upgrades") {
  TEST_CASE("Forwarded: an untrusted peer's is dropped, a trusted one's kept; ours appended") {
    const MessageHead req = requestHead(
        {{"Host", "api.example:8443"}, {"Forwarded", "for=6.6.6.6;host=admin.internal"}});
    UpstreamRequestContext c = upstreamContext();
    c.peer = "192.0.2.1";
    SUBCASE("untrusted") {
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "Forwarded") == one("for=192.0.2.1;host=\"api.example:8443\";proto=http"));
    }
    SUBCASE("trusted") {
      c.trusted_peer = true;
      const Serialized s = split(buildUpstreamRequestHead(req, c));
      CHECK(values(s, "Forwarded") == one("for=6.6.6.6;host=admin.internal, "
                                          "for=192.0.2.1;host=\"api.example:8443\";proto=http"));
    }
    SUBCASE("an IPv6 peer is a quoted, bracketed literal") {
      c.peer = "2001:db8::1";
      c.scheme = "https";
      const MessageHead plain = requestHead({{"Host", "h"}});
      const Serialized s = split(buildUpstreamRequestHead(plain, c));
      CHECK(values(s, "Forwarded") == one("for=\"[2001:db8::1]\";host=h;proto=https"));
    }
  }

  TEST_CASE("upgradeAnswers: a 101 names a protocol that was asked for") {
    auto headers = [](std::vector<Header> fields) {
      HeaderMap m;
      for (auto& f : fields) m.add(f.name, f.value);
      return m;
    };
    const HeaderMap asked = headers({{"Upgrade", "websocket, foo/2"}});
    CHECK(upgradeAnswers(asked, headers({{"Upgrade", "WebSocket"}})));
    CHECK(upgradeAnswers(asked, headers({{"Upgrade", "foo/2"}})));
    CHECK_FALSE(upgradeAnswers(asked, headers({})));
    CHECK_FALSE(upgradeAnswers(asked, headers({{"Upgrade", ""}})));
    CHECK_FALSE(upgradeAnswers(asked, headers({{"Upgrade", "h2c"}})));
    CHECK_FALSE(upgradeAnswers(asked, headers({{"Upgrade", "websocket, h2c"}})));
    CHECK_FALSE(upgradeAnswers(headers({}), headers({{"Upgrade", "websocket"}})));
  }
}

TEST_SUITE("http forwarding: responses") {
  TEST_CASE("a re-chunked response keeps its other transfer codings") {
    const MessageHead coded = responseHead(200, {{"Transfer-Encoding", "gzip, chunked"}});
    ClientResponseContext c;
    c.framing = Framing::Chunked;
    const Serialized s = split(buildClientResponseHead(coded, c));
    CHECK(values(s, "Transfer-Encoding") == one("gzip, chunked"));
    // close-delimited with a coding (no chunked): chunked is added after it
    const MessageHead close = responseHead(200, {{"Transfer-Encoding", "gzip"}});
    CHECK(values(split(buildClientResponseHead(close, c)), "Transfer-Encoding") ==
          one("gzip, chunked"));
  }

  TEST_CASE("responseFraming") {
    MessageHead with_length = responseHead(200, {{"Content-Length", "10"}});
    with_length.content_length = 10;
    MessageHead zero_length = responseHead(200, {{"Content-Length", "0"}});
    zero_length.content_length = 0;
    MessageHead chunked = responseHead(200, {{"Transfer-Encoding", "chunked"}});
    chunked.chunked = true;
    const MessageHead until_close = responseHead(200, {});

    CHECK(responseFraming(with_length, true, false) == Framing::None);  // HEAD
    CHECK(responseFraming(chunked, true, true) == Framing::None);
    for (int status : {204, 304, 100, 101, 103}) {
      MessageHead h = responseHead(status, {{"Content-Length", "10"}});
      h.content_length = 10;
      INFO(status);
      CHECK(responseFraming(h, false, false) == Framing::None);
    }
    CHECK(responseFraming(with_length, false, false) == Framing::ContentLength);
    CHECK(responseFraming(with_length, false, true) == Framing::ContentLength);
    CHECK(responseFraming(zero_length, false, false) == Framing::ContentLength);
    CHECK(responseFraming(chunked, false, false) == Framing::Chunked);
    CHECK(responseFraming(chunked, false, true) == Framing::CloseDelimited);
    CHECK(responseFraming(until_close, false, false) == Framing::Chunked);
    CHECK(responseFraming(until_close, false, true) == Framing::CloseDelimited);
  }

  TEST_CASE("status line: the upstream's reason, or the standard one") {
    MessageHead h = responseHead(200, {});
    h.reason = "Fine Thanks";
    CHECK(split(buildClientResponseHead(h, {})).start_line == "HTTP/1.1 200 Fine Thanks");
    h = responseHead(429, {});
    CHECK(split(buildClientResponseHead(h, {})).start_line == "HTTP/1.1 429 Too Many Requests");
    h = responseHead(404, {}, 0);  // an HTTP/1.0 upstream still answers the client in 1.1
    CHECK(split(buildClientResponseHead(h, {})).start_line == "HTTP/1.1 404 Not Found");
  }

  TEST_CASE("hop-by-hop fields of the response are removed, the rest kept in order") {
    MessageHead h = responseHead(200, {{"Content-Type", "text/plain"},
                                       {"Connection", "keep-alive, X-Hop"},
                                       {"Keep-Alive", "timeout=5"},
                                       {"Transfer-Encoding", "chunked"},
                                       {"Trailer", "X-Sum"},
                                       {"Upgrade", "h2c"},
                                       {"Proxy-Authenticate", "Basic"},
                                       {"X-Hop", "1"},
                                       {"Set-Cookie", "a=1"},
                                       {"Set-Cookie", "b=2"}});
    h.chunked = true;
    ClientResponseContext c;
    c.framing = Framing::Chunked;
    const Serialized s = split(buildClientResponseHead(h, c));
    for (const char* name :
         {"Connection", "Keep-Alive", "Upgrade", "Proxy-Authenticate", "X-Hop"}) {
      INFO(std::string(name));
      CHECK(values(s, name) == kNone);
    }
    CHECK(values(s, "Trailer") == one("X-Sum"));
    CHECK(values(s, "Transfer-Encoding") == one("chunked"));  // Sluice's own, once
    CHECK(values(s, "Content-Type") == one("text/plain"));
    CHECK(values(s, "Set-Cookie") == render({"a=1", "b=2"}));
    CHECK(s.terminated);
  }

  TEST_CASE("Content-Length is kept with its framing and dropped when the body is re-framed") {
    MessageHead h = responseHead(200, {{"Content-Length", "10"}});
    h.content_length = 10;
    ClientResponseContext c;
    SUBCASE("ContentLength") {
      c.framing = Framing::ContentLength;
      const Serialized s = split(buildClientResponseHead(h, c));
      CHECK(values(s, "Content-Length") == one("10"));
      CHECK(values(s, "Transfer-Encoding") == kNone);
    }
    SUBCASE("None (HEAD): Content-Length describes the representation") {
      c.framing = Framing::None;
      const Serialized s = split(buildClientResponseHead(h, c));
      CHECK(values(s, "Content-Length") == one("10"));
      CHECK(values(s, "Transfer-Encoding") == kNone);
    }
    SUBCASE("Chunked") {
      c.framing = Framing::Chunked;
      const Serialized s = split(buildClientResponseHead(h, c));
      CHECK(values(s, "Content-Length") == kNone);
      CHECK(values(s, "Transfer-Encoding") == one("chunked"));
    }
    SUBCASE("CloseDelimited") {
      c.framing = Framing::CloseDelimited;
      c.keep_alive = false;
      c.client_http10 = true;
      const Serialized s = split(buildClientResponseHead(h, c));
      CHECK(values(s, "Content-Length") == kNone);
      CHECK(values(s, "Transfer-Encoding") == kNone);
      CHECK(values(s, "Connection") == one("close"));
    }
  }

  TEST_CASE("Connection towards the client") {
    const MessageHead h = responseHead(200, {{"Connection", "close"}});
    ClientResponseContext c;
    c.framing = Framing::ContentLength;
    SUBCASE("HTTP/1.1, kept open: no Connection field") {
      c.keep_alive = true;
      c.client_http10 = false;
      CHECK(values(split(buildClientResponseHead(h, c)), "Connection") == kNone);
    }
    SUBCASE("HTTP/1.1, closing") {
      c.keep_alive = false;
      CHECK(values(split(buildClientResponseHead(h, c)), "Connection") == one("close"));
    }
    SUBCASE("HTTP/1.0, kept open") {
      c.keep_alive = true;
      c.client_http10 = true;
      CHECK(values(split(buildClientResponseHead(h, c)), "Connection") == one("keep-alive"));
    }
    SUBCASE("HTTP/1.0, closing") {
      c.keep_alive = false;
      c.client_http10 = true;
      CHECK(values(split(buildClientResponseHead(h, c)), "Connection") == one("close"));
    }
  }

  TEST_CASE("101 tunnel: Upgrade kept, Connection: upgrade") {
    const MessageHead h = responseHead(
        101, {{"Connection", "Upgrade"}, {"Upgrade", "websocket"}, {"Sec-WebSocket-Accept", "x"}});
    ClientResponseContext c;
    c.tunnel = true;
    c.framing = Framing::None;
    const Serialized s = split(buildClientResponseHead(h, c));
    CHECK(s.start_line == "HTTP/1.1 101 Switching Protocols");
    CHECK(values(s, "Upgrade") == one("websocket"));
    CHECK(values(s, "Connection") == one("upgrade"));
    CHECK(values(s, "Sec-WebSocket-Accept") == one("x"));
  }

  TEST_CASE("extra headers are included and Via is appended with the upstream's version") {
    const MessageHead h = responseHead(200, {{"Via", "1.1 app"}, {"Content-Length", "0"}}, 0);
    ClientResponseContext c;
    c.extra_headers =
        "RateLimit-Policy: \"per_ip\";q=100;w=60\r\nRateLimit: \"per_ip\";r=99;t=60\r\n";
    const std::string out = buildClientResponseHead(h, c);
    const Serialized s = split(out);
    CHECK(values(s, "RateLimit-Policy") == one("\"per_ip\";q=100;w=60"));
    CHECK(values(s, "RateLimit") == one("\"per_ip\";r=99;t=60"));
    CHECK(values(s, "Via") == one("1.1 app, 1.0 sluice"));
    CHECK(s.terminated);
    CHECK(s.body.empty());
  }

  TEST_CASE("chunk framing") {
    CHECK(chunkHeader(0) == "0\r\n");
    CHECK(chunkHeader(10) == "a\r\n");
    CHECK(chunkHeader(255) == "ff\r\n");
    CHECK(chunkHeader(4096) == "1000\r\n");
    CHECK(chunkHeader(SIZE_MAX) == "ffffffffffffffff\r\n");
    CHECK(kChunkEnd == "\r\n");
    CHECK(kLastChunk == "0\r\n\r\n");
    CHECK(continueResponse() == "HTTP/1.1 100 Continue\r\n\r\n");
  }

  TEST_CASE("clientResponseFields: HTTP/2 fields, lower case, no connection-specific one") {
    MessageHead h;
    h.status = 200;
    h.headers.add("Content-Type", "text/plain");
    h.headers.add("Connection", "keep-alive, X-Hop");
    h.headers.add("X-Hop", "1");
    h.headers.add("Keep-Alive", "timeout=5");
    h.headers.add("Transfer-Encoding", "chunked");
    h.headers.add("Upgrade", "h2c");
    h.headers.add("Content-Length", "12");
    h.chunked = true;
    const auto fields = clientResponseFields(h, "RateLimit: \"a\";r=1;t=2\r\nRetry-After: 3\r\n");
    std::vector<std::string> names;
    for (const auto& f : fields) names.push_back(f.name);
    CHECK(names == std::vector<std::string>{"content-type", "via", "ratelimit", "retry-after"});
    CHECK(fields[1].value == "1.1 sluice");
    CHECK(fields[2].value == "\"a\";r=1;t=2");
    MessageHead sized;
    sized.status = 200;
    sized.headers.add("Content-Length", "12");
    sized.content_length = 12;
    CHECK(clientResponseFields(sized, "")[0].name == "content-length");
  }
}

TEST_SUITE("http responses") {
  TEST_CASE("jsonString escapes quotes, backslashes and control bytes") {
    CHECK(jsonString("") == "\"\"");
    CHECK(jsonString("plain text") == "\"plain text\"");
    CHECK(jsonString("a\"b\\c") == "\"a\\\"b\\\\c\"");
    CHECK(jsonString("\n\r\t") == "\"\\n\\r\\t\"");
    CHECK(jsonString(std::string_view("\x01\x1f\0", 3)) == "\"\\u0001\\u001f\\u0000\"");
    CHECK(jsonString("\x7f") == "\"\\u007f\"");
    // Whatever goes in, a JSON parser reads back the same ASCII text.
    const std::string ascii = "quote\" back\\ nl\n ctl\x02 del\x7f end";
    CHECK(nlohmann::json::parse(jsonString(ascii)).get<std::string>() == ascii);
  }

  TEST_CASE("jsonString: any bytes give valid, ASCII-only JSON") {
    const std::string invalid = "bad \xff\xfe utf8 \xc3";
    const std::string out = jsonString(invalid);
    for (unsigned char c : out) CHECK(c < 0x80);
    CHECK(nlohmann::json::accept(out));
  }

  TEST_CASE("jsonString: valid UTF-8 reads back as the same text") {
    // "café ✓": a JSON parser must read the same characters back, not one per byte.
    const std::string text = "caf\xc3\xa9 \xe2\x9c\x93";
    nlohmann::json parsed;
    REQUIRE_NOTHROW(parsed = nlohmann::json::parse(jsonString(text)));
    CHECK(parsed.get<std::string>() == text);
  }

  TEST_CASE("problemResponse is problem+json") {
    const LocalResponse r = problemResponse(404, "no \"route\"\n here");
    CHECK(r.status == 404);
    CHECK(r.content_type == "application/problem+json");
    const auto j = nlohmann::json::parse(r.body);
    CHECK(j.at("type") == "about:blank");
    CHECK(j.at("title") == "Not Found");
    CHECK(j.at("status") == 404);
    CHECK(j.at("detail") == "no \"route\"\n here");
  }

  TEST_CASE("renderLocalResponse: status line, Content-Length that matches, body") {
    LocalResponse r = problemResponse(429, "slow down");
    r.extra_headers = "Retry-After: 7\r\n";
    const std::string out = renderLocalResponse(r, true, false, false);
    const Serialized s = split(out);
    CHECK(s.start_line == "HTTP/1.1 429 Too Many Requests");
    CHECK(values(s, "Content-Type") == one("application/problem+json"));
    CHECK(values(s, "Content-Length") == one(std::to_string(r.body.size())));
    CHECK(values(s, "Retry-After") == one("7"));
    CHECK(values(s, "Connection") == kNone);
    CHECK(s.body == r.body);
    CHECK(nlohmann::json::accept(s.body));
  }

  TEST_CASE("renderLocalResponse: HEAD keeps Content-Length and sends no body") {
    const LocalResponse r = problemResponse(404, "nothing here");
    const Serialized s = split(renderLocalResponse(r, true, true, false));
    CHECK(values(s, "Content-Length") == one(std::to_string(r.body.size())));
    CHECK(s.terminated);
    CHECK(s.body.empty());
  }

  TEST_CASE("renderLocalResponse: Connection close / keep-alive") {
    const LocalResponse r = problemResponse(400, "bad");
    CHECK(values(split(renderLocalResponse(r, false, false, false)), "Connection") == one("close"));
    CHECK(values(split(renderLocalResponse(r, false, false, true)), "Connection") == one("close"));
    CHECK(values(split(renderLocalResponse(r, true, false, true)), "Connection") ==
          one("keep-alive"));
    CHECK(values(split(renderLocalResponse(r, true, false, false)), "Connection") == kNone);
  }

  TEST_CASE("renderLocalResponse: an empty body is Content-Length: 0") {
    LocalResponse r;
    r.status = 200;
    r.content_type = "text/plain";
    const Serialized s = split(renderLocalResponse(r, true, false, false));
    CHECK(s.start_line == "HTTP/1.1 200 OK");
    CHECK(values(s, "Content-Length") == one("0"));
    CHECK(s.body.empty());
  }
}

TEST_SUITE("http responses: HTTP/2") {
  TEST_CASE("localResponseFields: the same head as renderLocalResponse, as fields") {
    LocalResponse r = problemResponse(429, "slow down");
    r.extra_headers = "Retry-After: 7\r\n";
    const auto fields = localResponseFields(r);
    std::vector<std::string> names;
    for (const auto& f : fields) names.push_back(f.name);
    CHECK(names == std::vector<std::string>{"server", "content-type", "content-length",
                                            "cache-control", "retry-after"});
    CHECK(fields[2].value == std::to_string(r.body.size()));
    CHECK(fields[4].value == "7");
  }
}
