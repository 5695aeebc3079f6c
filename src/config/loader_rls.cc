#include <algorithm>
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
  section(r, "tls", [&](TableReader& t) { readCertificate(t, &rls.tls.emplace()); });
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
        r.error("config", "not a folder: " + inQuotes(rls.config_dir) +
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
  entries(r, "descriptor", [&](TableReader& e) { loadRlsDescriptor(e, rls); });
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

// [[rls.descriptor]]: a descriptor pattern of a domain decided by a Sluice limit.
void Loader::loadRlsDescriptor(TableReader& r, RlsConfig& rls) {
  RlsDescriptorConfig d;
  if (auto v = r.string("domain")) {
    if (v->empty()) r.error("domain", "must not be empty");
    d.domain = *v;
  } else if (!r.has("domain")) {
    r.missing("domain");
  }
  bool entries_ok = false;
  if (auto items = r.strings("entries")) {
    entries_ok = true;
    if (items->empty() || items->size() > 16) {
      r.error("entries", "must list 1 to 16 keys, as a descriptor has them");
      entries_ok = false;
    }
    for (const StringItem& item : *items) {
      // "key", or "key=value" (the first '=' ends the key).
      const size_t eq = item.value.find('=');
      RlsDescriptorConfig::Entry entry{item.value.substr(0, eq),
                                       eq == std::string::npos ? "" : item.value.substr(eq + 1)};
      if (entry.key.empty() || (eq != std::string::npos && entry.value.empty())) {
        diag_.add(*item.node, item.path,
                  "expected \"key\" or \"key=value\", got " + inQuotes(item.value));
        entries_ok = false;
      }
      if (!d.pattern.empty()) d.pattern += '.';
      d.pattern += entry.value.empty() ? entry.key : entry.key + "_" + entry.value;
      d.entries.push_back(std::move(entry));
    }
  } else if (!r.has("entries")) {
    r.missing("entries");
  }
  const LimitConfig* limit = nullptr;
  if (auto name = r.string("limit")) {
    d.limit = *name;
    if (const auto* entry = limits_.find(*name)) {
      d.limit_index = entry->index;
      limit = &config_.limits[entry->index];
      if (!limit->cost_from_header.empty()) {
        r.error("limit", "limit " + inQuotes(*name) +
                             " has cost_from: a rate limit service never sees the response");
        limit = nullptr;
      }
    } else {
      r.error("limit", "unknown limit " + inQuotes(*name) + didYouMean(*name, limits_.names));
    }
  } else if (!r.has("limit")) {
    r.missing("limit");
  }
  // A concurrency limit's slot: named by the value of the entry `slot`, taken by the call, or
  // freed (`release`).
  if (auto release = r.boolean("release")) d.release = *release;
  if (auto slot = r.string("slot")) {
    size_t i = 0;
    while (i < d.entries.size() && d.entries[i].key != *slot) ++i;
    if (i == d.entries.size()) {
      if (entries_ok) r.error("slot", "not a key of entries: " + inQuotes(*slot));
      entries_ok = false;
    } else if (!d.entries[i].value.empty()) {
      r.error("slot", "entry " + inQuotes(*slot) +
                          " has a fixed value: a slot is named by a value unique per request");
      entries_ok = false;
    } else {
      d.slot_entry = i;
    }
  }
  const bool concurrency = limit && limit->algorithm == Algorithm::Concurrency;
  if (concurrency && !r.has("slot")) {
    r.error("limit", "limit " + inQuotes(d.limit) +
                         " is a concurrency limit: `slot` names the entry whose value (unique "
                         "per request, as Envoy's x-request-id) names the slot a call takes");
  } else if (limit && !concurrency && r.has("slot")) {
    r.error("slot", "limit " + inQuotes(d.limit) + " is not a concurrency limit: it has no slots");
  } else if (limit && !concurrency && d.release) {
    r.error("release",
            "limit " + inQuotes(d.limit) + " is not a concurrency limit: it has no slots to free");
  }
  // The entries whose values key the limit: `key`, else every entry without a fixed value but
  // the slot's.
  const bool has_key = r.has("key");
  if (auto items = r.strings("key")) {
    for (const StringItem& item : *items) {
      size_t i = 0;
      while (i < d.entries.size() && d.entries[i].key != item.value) ++i;
      if (i == d.entries.size()) {
        if (entries_ok) {
          diag_.add(*item.node, item.path, "not a key of entries: " + inQuotes(item.value));
        }
        entries_ok = false;
      } else if (i == d.slot_entry) {
        diag_.add(*item.node, item.path,
                  "the slot's entry " + inQuotes(item.value) + " cannot key the limit too");
        entries_ok = false;
      }
      d.key_entries.push_back(i);
    }
  } else if (!has_key) {
    for (size_t i = 0; i < d.entries.size(); ++i) {
      if (d.entries[i].value.empty() && i != d.slot_entry) d.key_entries.push_back(i);
    }
  }
  if (limit && entries_ok && d.key_entries.size() != limit->by.size()) {
    std::string by;
    for (const KeyPart& part : limit->by) by += (by.empty() ? "" : ", ") + part.text;
    r.error(has_key ? "key" : "entries",
            "limit " + inQuotes(d.limit) + " is keyed on " + std::to_string(limit->by.size()) +
                " part(s) (" + by + "), and " + std::to_string(d.key_entries.size()) +
                " entry value(s) key it here: name the entries that do in `key`, in the order "
                "of its `by`");
  }
  for (size_t i = 0; i < rls.descriptors.size(); ++i) {
    const RlsDescriptorConfig& other = rls.descriptors[i];
    const bool same_entries = std::equal(
        other.entries.begin(), other.entries.end(), d.entries.begin(), d.entries.end(),
        [](const auto& a, const auto& b) { return a.key == b.key && a.value == b.value; });
    if (other.domain == d.domain && same_entries && !d.entries.empty()) {
      r.error("entries", "the same pattern as rls.descriptor[" + std::to_string(i) +
                             "] (the first would always match)");
    }
  }
  rls.descriptors.push_back(std::move(d));
}

}  // namespace sluice::config::loader_internal
