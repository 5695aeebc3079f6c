#include <filesystem>
#include <memory>
#include <tuple>
#include <utility>

#include "config/loader_sections.h"
#include "config/ratelimit_yaml.h"

namespace sluice::config::loader_internal {

namespace {

// Two listeners on one port whose hosts overlap (the same, or either a wildcard): with
// SO_REUSEPORT both would bind, and the kernel would split clients between them.
bool overlaps(const SocketAddress& a, const SocketAddress& b) {
  auto wildcard = [](const std::string& host) { return host == "0.0.0.0" || host == "::"; };
  auto named = [](const std::string& host) -> std::string {
    return host == "localhost" ? "127.0.0.1" : host;
  };
  return a.port == b.port &&
         (named(a.host) == named(b.host) || wildcard(a.host) || wildcard(b.host));
}

}  // namespace

// [rls]: Sluice as Envoy's rate limit service.

void Loader::loadRls(TableReader& r) {
  RlsConfig rls;
  if (auto v = r.address("listen", AddressUse::Listen)) {
    rls.listen = *v;
    for (const auto& [other, key] : {std::pair{&config_.server.listen, "[server] listen"},
                                     std::pair{&config_.admin.listen, "[admin] listen"}}) {
      if (overlaps(rls.listen, *other)) {
        r.error("listen", "the same address as " + std::string(key) + " (" + other->text +
                              "): the rate limit service needs a port of its own");
      }
    }
  } else if (!r.has("listen")) {
    r.missing("listen");
  }
  section(r, "tls", [&](TableReader& t) {
    readCertificate(t, &rls.tls.emplace());
    // The listener serves h2c only so far: its TLS is checked, and refused until it works.
    t.error("cert",
            "TLS on the rate limit service's listener is not served in this version yet: "
            "[rls.tls] is checked but cannot be used (serve h2c on loopback, or put a TLS "
            "terminating proxy in front)");
  });
  if (auto v = r.boolean("merge_domains")) rls.merge_domains = *v;
  if (auto v = r.enumeration<RlsConfig::Charge>(
          "charge", {{"all_or_nothing", RlsConfig::Charge::AllOrNothing},
                     {"each", RlsConfig::Charge::Each}})) {
    rls.charge = *v;
  }
  if (auto v = r.enumeration<OnError>("on_error",
                                      {{"allow", OnError::Allow}, {"deny", OnError::Deny}})) {
    rls.on_error = *v;
  }
  if (auto dir = r.string("config")) {
    if (dir->empty()) {
      r.error("config", "must not be empty (leave it out for no YAML limits)");
    } else {
      // Relative to the configuration file's folder, as envoyproxy/ratelimit's files sit
      // beside the deployment's other configuration.
      std::filesystem::path path(*dir);
      if (path.is_relative()) {
        path = std::filesystem::path(config_.source_path).parent_path() / path;
      }
      rls.config_dir = path.lexically_normal().string();
      std::error_code ec;
      if (!std::filesystem::is_directory(rls.config_dir, ec)) {
        r.error("config", "not a folder: " + loader_internal::quoted(rls.config_dir) +
                              (ec ? " (" + ec.message() + ")" : std::string()));
      } else {
        auto yaml = std::make_shared<RateLimitYaml>();
        std::string error;
        if (yaml->addDirectory(rls.config_dir, rls.merge_domains, error)) {
          rls.yaml = std::move(yaml);
        } else {
          r.error("config", error);  // "FILE:LINE:COL: why" of the YAML file
        }
      }
    }
  }
  config_.rls = std::move(rls);
  // The calls the listener answers, as routes of their own (the requests, the access log
  // and the gRPC counters name them like any route).
  for (const auto& [name, path, service] :
       {std::tuple{"rls:should_rate_limit",
                   "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                   RouteConfig::Service::RlsShouldRateLimit},
        std::tuple{"rls:health_check", "/grpc.health.v1.Health/Check",
                   RouteConfig::Service::GrpcHealthCheck}}) {
    RouteConfig& route = config_.routes.emplace_back();
    route.name = name;
    route.match.path = path;
    route.match.methods = {"POST"};
    route.service = service;
  }
}

}  // namespace sluice::config::loader_internal
