// Request-target normalization and route matching (src/proxy/router.h): the path that a route
// matches is the path that is forwarded, so no spelling of /login dodges a limit on /login.

#include "proxy/router.h"

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <string_view>

#include "config/loader.h"
#include "http/path.h"
#include "http/request_line.h"

using sluice::config::Config;
using sluice::config::RouteConfig;
using sluice::proxy::matchRoute;
using sluice::proxy::normalizeHost;
using sluice::proxy::parseTarget;
using sluice::proxy::Target;

namespace {

// NUL and other control bytes made visible in failure messages.
std::string visible(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20) {
      out += "\\x" + std::string(1, "0123456789abcdef"[(c >> 4) & 15]) +
             std::string(1, "0123456789abcdef"[c & 15]);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The normalized path, or "REFUSED: why".
std::string path(std::string_view target) {
  std::string error;
  auto t = parseTarget(target, &error);
  if (!t) return "REFUSED: " + error;
  return t->path;
}

Target accepted(std::string_view target) {
  std::string error;
  auto t = parseTarget(target, &error);
  INFO(visible(target) << " -> " << error);
  REQUIRE(t.has_value());
  return *t;
}

void refused(std::string_view target) {
  std::string error;
  auto t = parseTarget(target, &error);
  INFO(visible(target) << " -> " << (t ? visible(t->path) : std::string("(refused)")));
  CHECK_FALSE(t.has_value());
  CHECK_FALSE(error.empty());  // and says why
}

RouteConfig route(std::string name, std::string path_prefix, std::string exact_path,
                  std::string host, std::vector<std::string> methods) {
  RouteConfig r;
  r.name = std::move(name);
  r.match.path_prefix = std::move(path_prefix);
  r.match.path = std::move(exact_path);
  r.match.host = std::move(host);
  r.match.methods = std::move(methods);
  return r;
}

// The name of the route that matches, or "-".
std::string routeName(const Config& c, std::string_view method, std::string_view host,
                      std::string_view p) {
  const RouteConfig* r = matchRoute(c, method, host, p);
  return r ? r->name : "-";
}

}  // namespace

TEST_SUITE("router: parseTarget") {
  TEST_CASE("origin-form: path and raw query") {
    const Target t = accepted("/a/b?x=1&y=%2e%2e/../&z");
    CHECK(t.path == "/a/b");
    CHECK(t.has_query);
    CHECK(t.query == "x=1&y=%2e%2e/../&z");
    CHECK(t.authority.empty());
    CHECK(t.originForm() == "/a/b?x=1&y=%2e%2e/../&z");
  }

  TEST_CASE("no query, and an empty query") {
    const Target plain = accepted("/a");
    CHECK_FALSE(plain.has_query);
    CHECK(plain.query.empty());
    CHECK(plain.originForm() == "/a");
    const Target empty = accepted("/a?");
    CHECK(empty.has_query);
    CHECK(empty.query.empty());
    CHECK(empty.originForm() == "/a?");
  }

  TEST_CASE("the root") {
    CHECK(path("/") == "/");
    CHECK(accepted("/?q").originForm() == "/?q");
  }

  TEST_CASE("absolute-form: authority kept, path and query split") {
    const Target t = accepted("http://Example.COM:8080/a/./b?q=1");
    CHECK(t.authority == "Example.COM:8080");
    CHECK(t.path == "/a/b");
    CHECK(t.has_query);
    CHECK(t.query == "q=1");
    CHECK(t.originForm() == "/a/b?q=1");

    const Target bare = accepted("https://example.com");
    CHECK(bare.authority == "example.com");
    CHECK(bare.path == "/");
    CHECK_FALSE(bare.has_query);

    const Target query_only = accepted("HTTP://example.com?x=1");
    CHECK(query_only.authority == "example.com");
    CHECK(query_only.path == "/");
    CHECK(query_only.has_query);
    CHECK(query_only.query == "x=1");

    const Target v6 = accepted("http://[::1]:8080/x");
    CHECK(v6.authority == "[::1]:8080");
    CHECK(v6.path == "/x");
  }

  TEST_CASE("absolute-form paths are normalized like origin-form ones") {
    CHECK(path("http://h/a/%6cogin") == "/a/login");
    CHECK(path("http://h/a/../login") == "/login");
    refused("http://h/../login");
  }

  TEST_CASE("other forms are refused") {
    refused("");
    refused("*");                // OPTIONS *
    refused("example.com:443");  // authority-form (CONNECT)
    refused("a/b");
    refused("ftp://example.com/file");  // not http(s)
    refused("http:///no-authority");
    refused("http://user:pass@example.com/");  // userinfo
  }

  TEST_CASE("dot-segments are removed (RFC 3986 5.2.4)") {
    CHECK(path("/a/./b") == "/a/b");
    CHECK(path("/a/b/../c") == "/a/c");
    CHECK(path("/a/b/..") == "/a/");
    CHECK(path("/a/b/.") == "/a/b/");
    CHECK(path("/a/..") == "/");
    CHECK(path("/.") == "/");
    CHECK(path("/./") == "/");
    CHECK(path("/a/b/") == "/a/b/");
    CHECK(path("/x/../login") == "/login");
    CHECK(path("/a/./../b/./c/") == "/b/c/");
    CHECK(path("/a/.../b") == "/a/.../b");  // not a dot-segment
    CHECK(path("/a/..b/c") == "/a/..b/c");
    CHECK(path("//a//b") == "/a/b");  // slashes merged, as nginx's merge_slashes
    CHECK(path("/a//../b") == "/b");  // merged before dot-segments, as nginx and Tomcat
    CHECK(path("/a/b//") == "/a/b/");
    CHECK(path("//") == "/");
  }

  TEST_CASE("routes match without path parameters; they are forwarded") {
    const Target t = accepted("/formlogin;jsessionid=1?x=1");
    CHECK(t.path == "/formlogin;jsessionid=1");
    CHECK(t.match_path == "/formlogin");
    CHECK(t.raw_path == "/formlogin;jsessionid=1");
    CHECK(t.originForm() == "/formlogin;jsessionid=1?x=1");
    // "..;" is a dot-segment to servlet containers: it is one for matching too.
    const Target dots = accepted("/x/..;/admin/");
    CHECK(dots.path == "/x/..;/admin/");
    CHECK(dots.match_path == "/admin/");
    refused("/..;/admin");  // climbs above the root once the parameter is dropped
    CHECK(accepted("/a;b/c;d/").match_path == "/a/c/");
    CHECK(accepted("/;x").match_path == "/");
  }

  TEST_CASE("the original path is kept as sent") {
    const Target t = accepted("//a/%2e/b%41?q");
    CHECK(t.raw_path == "//a/%2e/b%41");
    CHECK(t.originForm(true) == "//a/%2e/b%41?q");
    CHECK(t.originForm() == "/a/bA?q");
    CHECK(accepted("http://h?q").originForm(true) == "/?q");
  }

  TEST_CASE("a path that climbs above the root is refused") {
    refused("/..");
    refused("/../");
    refused("/../login");
    refused("/a/../../b");
    refused("/a/./../../b");
  }

  TEST_CASE("unreserved escapes are decoded before dot-segments are resolved") {
    CHECK(path("/%6cogin") == "/login");
    CHECK(path("/%6Cogin") == "/login");
    CHECK(path("/%41%5a%61%7a%30%39%2d%2e%5f%7e") == "/AZaz09-._~");
    // An encoded dot-segment is a dot-segment: resolved, or refused when it climbs.
    CHECK(path("/a/%2e%2e/login") == "/login");
    CHECK(path("/a/%2E/b") == "/a/b");
    CHECK(path("/a/.%2e/login") == "/login");
    refused("/%2e%2e/login");
    refused("/a/%2e%2e/%2E%2E/login");
  }

  TEST_CASE("reserved and other escapes are kept, with upper-case hex") {
    CHECK(path("/a%2fb") == "/a%2Fb");  // an encoded '/' is not a separator
    CHECK(path("/a%2Fb") == "/a%2Fb");
    CHECK(path("/a%2f..%2fb") == "/a%2F..%2Fb");  // one segment, not a dot-segment
    CHECK(path("/%3f%23%25%20") == "/%3F%23%25%20");
    CHECK(path("/caf%c3%a9") == "/caf%C3%A9");
    CHECK(path("/%7f") == "/%7F");
  }

  TEST_CASE("malformed escapes and NUL are refused") {
    refused("/%");
    refused("/a%");
    refused("/a%4");
    refused("/%zz");
    refused("/%g0");
    refused("/%0g");
    refused("/%%41");
    refused("/%00");
    refused("/a%00b");
  }

  TEST_CASE("a fragment never becomes part of the routed path") {
    // '#' cannot appear in a request-target (RFC 9112 3.2), but llhttp passes it through. An
    // upstream that strips it (Node, Python) would serve /login for "/login#x", so routing on
    // "/login#x" would dodge a limit on path = "/login". Refused, or cut: either is safe.
    for (const std::string target : {"/login#x", "/lo%67in#frag?x=1", "http://h/login#x"}) {
      INFO(target);
      std::string error;
      auto t = parseTarget(target, &error);
      if (t) {
        CHECK(t->path == "/login");
        CHECK(t->originForm().find('#') == std::string::npos);
      }
    }
  }

  TEST_CASE("a raw NUL is refused like an encoded one") {
    // llhttp refuses it first on the wire; parseTarget promises it on its own too.
    refused(std::string_view("/a\0b", 4));
    refused(std::string_view("http://h/\0", 10));
  }

  TEST_CASE("bytes HTTP/1.1 refuses in a target are refused for HTTP/2's :path too") {
    for (std::string_view t : {"/login\xa0", "/login\x80", "/l\xc3\xa9gin", "/a?q=\xff", "/a b",
                               "/a\tb", "/a\x7f", "http://h/\xa0"}) {
      refused(t);
    }
    accepted("/a-._~!$&'()*+,;=:@%41?q=[]{}|^`\\\"<>");
    CHECK(sluice::http::visibleAscii("/!~"));
    CHECK_FALSE(sluice::http::visibleAscii("/\x20"));
  }

  TEST_CASE("a method is one of HTTP/1.1's, in its exact spelling") {
    for (std::string_view m : {"GET", "POST", "DELETE", "PATCH", "PURGE", "M-SEARCH", "SOURCE"}) {
      CHECK(sluice::http::knownMethod(m));
    }
    for (std::string_view m :
         {"post", "Post", "pOST", "FOO", "PRI", "QUERY", "", "GET ", "MSEARCH"}) {
      INFO(m);
      CHECK_FALSE(sluice::http::knownMethod(m));
    }
  }

  TEST_CASE("checkRequestHead: CONNECT, and one Host that is a host[:port], for both codecs") {
    auto head = [](std::string method, std::vector<std::string> hosts, int minor = 1) {
      sluice::http::MessageHead h;
      h.method = std::move(method);
      h.target = "/";
      h.version_minor = minor;
      for (auto& host : hosts) h.headers.add("Host", host);
      return h;
    };
    auto status = [](const sluice::http::MessageHead& h) {
      const auto refusal = sluice::http::checkRequestHead(h);
      return refusal ? refusal->status : 0;
    };
    CHECK(status(head("GET", {"api.example:8080"})) == 0);
    CHECK(status(head("GET", {"[::1]:80"})) == 0);
    CHECK(status(head("GET", {}, 0)) == 0);  // HTTP/1.0 may leave Host out
    CHECK(status(head("CONNECT", {"api.example:443"})) == 405);
    CHECK(status(head("GET", {})) == 400);
    CHECK(status(head("GET", {"a", "b"})) == 400);
    CHECK(status(head("GET", {"a b"})) == 400);
    CHECK(status(head("GET", {"a/b"})) == 400);
    CHECK(std::string(sluice::http::checkRequestHead(head("GET", {}))->why) ==
          "a request needs a Host field (on HTTP/2, :authority)");
  }

  TEST_CASE("the last escape of a path is decoded (no off-by-one at the end)") {
    CHECK(path("/a%41") == "/aA");
    CHECK(path("/%41") == "/A");
  }

  TEST_CASE("isNormalPath: exactly the paths that decoding and normalizing leave as they are") {
    using sluice::http::decodeUnreserved;
    using sluice::http::isNormalPath;
    using sluice::http::normalizePath;
    CHECK(isNormalPath("/"));
    CHECK(isNormalPath("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"));
    CHECK(isNormalPath("/a/b/"));
    CHECK(isNormalPath("/a/.b/..c/;x"));
    for (std::string_view p : {"", "a", "//", "/a//b", "/.", "/..", "/a/./b", "/a/../b", "/a/.",
                               "/%41", "/a%2F", "/a/.."}) {
      CHECK_MESSAGE(!isNormalPath(p), p);
    }
    // Every path of up to 5 characters from the bytes that matter, against the slow way.
    const std::string alphabet = "/.%;a4";
    size_t normal = 0;
    std::string p;
    std::function<void(size_t)> each = [&](size_t left) {
      if (!p.empty() && p[0] == '/') {
        std::string decoded, normalized, error;
        const bool same = decodeUnreserved(p, &decoded, &error) &&
                          normalizePath(decoded, false, &normalized, &error) && normalized == p;
        CHECK_MESSAGE(isNormalPath(p) == same, p);
        normal += same ? 1 : 0;
      }
      if (left == 0) return;
      for (char c : alphabet) {
        p.push_back(c);
        each(left - 1);
        p.pop_back();
      }
    };
    each(5);
    CHECK(normal > 100);
  }
}

TEST_SUITE("router: normalizeHost") {
  TEST_CASE("lower case, port and trailing dot dropped") {
    CHECK(normalizeHost("Example.COM:8080") == "example.com");
    CHECK(normalizeHost("example.com") == "example.com");
    CHECK(normalizeHost("example.com.") == "example.com");
    CHECK(normalizeHost("Example.com.:443") == "example.com");
    CHECK(normalizeHost("  api.example.com \t") == "api.example.com");
    CHECK(normalizeHost("192.0.2.1:80") == "192.0.2.1");
    CHECK(normalizeHost("") == "");
  }

  TEST_CASE("IPv6 literals keep their brackets") {
    CHECK(normalizeHost("[::1]:80") == "[::1]");
    CHECK(normalizeHost("[::1]") == "[::1]");
    CHECK(normalizeHost("[2001:DB8::A]:8443") == "[2001:db8::a]");
  }
}

TEST_SUITE("router: matchRoute") {
  TEST_CASE("first match wins; path, path_prefix, methods and host") {
    Config c;
    c.routes.push_back(route("admin", "", "", "admin.example.com", {}));
    c.routes.push_back(route("login", "", "/login", "", {"POST"}));
    c.routes.push_back(route("api-read", "/api/", "", "", {"GET", "HEAD"}));
    c.routes.push_back(route("api-any", "/api/", "", "", {}));
    c.routes.push_back(route("static", "/static", "", "", {}));

    CHECK(routeName(c, "POST", "example.com", "/login") == "login");
    CHECK(routeName(c, "GET", "example.com", "/login") == "-");
    CHECK(routeName(c, "POST", "example.com", "/login/") == "login");  // a trailing slash
    CHECK(routeName(c, "POST", "example.com", "/logins") == "-");
    CHECK(routeName(c, "POST", "example.com", "/Login") == "-");
    // The admin host takes every path, before the routes below it.
    CHECK(routeName(c, "POST", "admin.example.com", "/login") == "admin");
    CHECK(routeName(c, "DELETE", "admin.example.com", "/anything") == "admin");
    CHECK(routeName(c, "GET", "example.com", "/api/v1/users") == "api-read");
    CHECK(routeName(c, "HEAD", "example.com", "/api/") == "api-read");
    CHECK(routeName(c, "DELETE", "example.com", "/api/v1/users") == "api-any");
    CHECK(routeName(c, "get", "example.com", "/api/v1") ==
          "api-any");  // methods are case-sensitive
    CHECK(routeName(c, "GET", "example.com", "/api") == "-");
    CHECK(routeName(c, "GET", "example.com", "/apix/") == "-");
    CHECK(routeName(c, "GET", "", "/static/app.js") == "static");
    CHECK(routeName(c, "GET", "example.com", "/staticfile") == "static");  // a string prefix
    CHECK(routeName(c, "GET", "example.com", "/") == "-");
    // The pointer is into the configuration.
    CHECK(matchRoute(c, "POST", "", "/login") == &c.routes[1]);
  }

  TEST_CASE("case_insensitive compares paths ignoring ASCII case") {
    Config c;
    c.routes.push_back(route("login", "", "/formlogin", "", {}));
    c.routes.back().match.case_insensitive = true;
    c.routes.push_back(route("admin", "/admin/", "", "", {}));
    c.routes.back().match.case_insensitive = true;
    c.routes.push_back(route("api", "/api/", "", "", {}));
    CHECK(routeName(c, "GET", "", "/FormLogin") == "login");
    CHECK(routeName(c, "GET", "", "/FORMLOGIN/") == "login");
    CHECK(routeName(c, "GET", "", "/ADMIN/x") == "admin");
    CHECK(routeName(c, "GET", "", "/API/x") == "-");  // case counts without it
    CHECK(routeName(c, "GET", "", "/api/x") == "api");
  }

  TEST_CASE("host and path conditions together") {
    Config c;
    c.routes.push_back(route("a", "/x/", "", "a.example", {"GET"}));
    c.routes.push_back(route("b", "/x/", "", "b.example", {}));
    CHECK(routeName(c, "GET", "a.example", "/x/1") == "a");
    CHECK(routeName(c, "POST", "a.example", "/x/1") == "-");
    CHECK(routeName(c, "POST", "b.example", "/x/1") == "b");
    CHECK(routeName(c, "GET", "c.example", "/x/1") == "-");
    CHECK(routeName(c, "GET", "a.example", "/y/1") == "-");
  }

  TEST_CASE(
      "a service route matches on the service's listener only, and only service routes "
      "do") {
    Config c;
    c.routes.push_back(route("all", "/", "", "", {}));
    c.routes.push_back(route("rls:should_rate_limit", "", "/svc/Method", "", {"POST"}));
    c.routes.back().service = RouteConfig::Service::RlsShouldRateLimit;
    CHECK(matchRoute(c, "POST", "", "/svc/Method") == &c.routes[0]);
    CHECK(matchRoute(c, "POST", "", "/svc/Method", true) == &c.routes[1]);
    CHECK(matchRoute(c, "POST", "", "/other", true) == nullptr);
    CHECK(matchRoute(c, "GET", "", "/svc/Method", true) == nullptr);
  }

  TEST_CASE("no routes: nothing matches") {
    Config c;
    CHECK(matchRoute(c, "GET", "h", "/") == nullptr);
  }

  TEST_CASE("a catch-all route matches everything") {
    Config c;
    c.routes.push_back(route("all", "", "", "", {}));
    CHECK(routeName(c, "PATCH", "any.host", "/deep/path") == "all");
  }

  TEST_CASE("normalized targets and hosts meet a loaded configuration") {
    sluice::config::LoadResult result = sluice::config::loadConfigString(R"([[upstream]]
name = "app"
endpoints = ["127.0.0.1:9000"]

[[route]]
name = "login"
match = { path = "/login", methods = ["post"] }
upstream = "app"

[[route]]
name = "admin"
match = { path_prefix = "/admin/", host = "Admin.Example.com" }
upstream = "app"

[[route]]
name = "api"
match = { path_prefix = "/api/" }
upstream = "app"
)",
                                                                         "router.toml");
    std::string errors;
    for (const auto& e : result.errors) errors += e.toString() + "\n";
    INFO(errors);
    REQUIRE(result.ok());
    const Config& c = *result.config;

    auto routeOf = [&](std::string_view method, std::string_view host, std::string_view target) {
      std::string error;
      auto t = parseTarget(target, &error);
      if (!t) return std::string("REFUSED");
      return routeName(c, method, normalizeHost(host), t->path);
    };
    CHECK(routeOf("POST", "example.com", "/login") == "login");
    CHECK(routeOf("POST", "example.com", "/%6cogin") == "login");
    CHECK(routeOf("POST", "example.com", "/x/../login") == "login");
    CHECK(routeOf("POST", "example.com", "/api/%2e%2e/login") == "login");
    CHECK(routeOf("POST", "example.com", "/./login") == "login");
    CHECK(routeOf("POST", "example.com", "/../login") == "REFUSED");
    CHECK(routeOf("GET", "example.com", "/login") == "-");
    CHECK(routeOf("GET", "ADMIN.example.COM:8443", "/admin/users") == "admin");
    CHECK(routeOf("GET", "admin.example.com.", "/admin/users") == "admin");
    CHECK(routeOf("GET", "other.example.com", "/admin/users") == "-");
    CHECK(routeOf("GET", "example.com", "/api/v1?x=/../") == "api");
  }
}
