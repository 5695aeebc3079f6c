#include "config/loader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <system_error>
#include <utility>

#include "config/loader_table_reader.h"

namespace sluice::config {

std::string ConfigError::toString() const {
  std::string out = file;
  if (line > 0) {
    out += (out.empty() ? "" : ":") + std::to_string(line);
    if (column > 0) out += ":" + std::to_string(column);
  }
  if (!out.empty()) out += ": ";
  if (!key.empty()) out += key + ": ";
  return out + message;
}

namespace {

using namespace loader_internal;

// A configuration file bigger than this is a mistake (a log file given by accident).
constexpr size_t kMaxFileBytes = 16 << 20;

// POSIX shells accept [A-Za-z_][A-Za-z0-9_]* as variable names.
bool isEnvironmentName(std::string_view name) {
  return isName(name) && name.find_first_of(".-") == std::string_view::npos &&
         !(name[0] >= '0' && name[0] <= '9');
}

std::string errnoMessage(int error) { return std::generic_category().message(error); }

// Only checks that the file can be opened for reading: whether it holds a usable PEM
// certificate or key is for the TLS code to say when it loads it.
std::optional<std::string> unreadableFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errnoMessage(errno);
  if (S_ISDIR(st.st_mode)) return errnoMessage(EISDIR);
  if (::access(path.c_str(), R_OK) != 0) return errnoMessage(errno);
  return std::nullopt;
}

// Where each name of one kind (upstream, limit, ...) was declared, to resolve references and
// refuse duplicates.
struct NameIndex {
  struct Entry {
    size_t index;
    int line;
  };
  std::map<std::string, Entry> entries;
  std::vector<std::string> names;  // for suggestions

  const Entry* find(const std::string& name) const {
    auto it = entries.find(name);
    return it == entries.end() ? nullptr : &it->second;
  }
};

// Walks the root table and fills a Config, section by section. References between sections
// (a route's upstream and limits, a plan's limits, a tenant's plan) are resolved against the
// entries read before them, hence the order in load().
class Loader {
 public:
  Loader(Diagnostics& diag, Config& config) : diag_(diag), config_(config) {}

  void load(const toml::table& root) {
    TableReader r(root, "", diag_);
    section(r, "server", [&](TableReader& s) { loadServer(s); });
    section(r, "admin", [&](TableReader& s) {
      if (auto v = s.address("listen", AddressUse::Listen)) config_.admin.listen = *v;
    });
    section(r, "log", [&](TableReader& s) { loadLog(s); });
    const bool has_valkey_table = section(r, "valkey", [&](TableReader& s) { loadValkey(s); });
    section(r, "identity", [&](TableReader& s) { loadIdentity(s); });
    entries(r, "upstream", [&](TableReader& e) { loadUpstream(e); });
    entries(r, "limit", [&](TableReader& e) { loadLimit(e); });
    entries(r, "route", [&](TableReader& e) { loadRoute(e); });
    entries(r, "plan", [&](TableReader& e) { loadPlan(e); });
    entries(r, "tenant", [&](TableReader& e) { loadTenant(e); });
    r.finish();

    if ((has_valkey_table || !config_.limits.empty()) && !config_.hasValkey()) {
      std::string unused;
      config_.valkey.address = parseSocketAddress("127.0.0.1:6379", false, &unused);
    }
  }

 private:
  // A [name] table; returns whether it is present.
  template <class F>
  bool section(TableReader& parent, std::string_view key, F&& read) {
    const toml::node* node = parent.node(key);
    if (!node) return false;
    const toml::table* table = node->as_table();
    if (!table) {
      diag_.add(*node, parent.keyPath(key), "expected a table, got " + describe(*node));
      return true;
    }
    TableReader reader(*table, parent.keyPath(key), diag_);
    read(reader);
    reader.finish();
    return true;
  }

  // The entries of a [[name]] array of tables, each read under the path "name[i]".
  template <class F>
  void entries(TableReader& parent, std::string_view key, F&& read) {
    const toml::node* node = parent.node(key);
    if (!node) return;
    const std::string path = parent.keyPath(key);
    const toml::array* array = node->as_array();
    if (!array) {
      diag_.add(*node, path,
                "expected an array of tables ([[" + path + "]]), got " + describe(*node));
      return;
    }
    for (size_t i = 0; i < array->size(); ++i) {
      const toml::node& element = *array->get(i);
      const std::string element_path = path + "[" + std::to_string(i) + "]";
      const toml::table* table = element.as_table();
      if (!table) {
        diag_.add(element, element_path, "expected a table, got " + describe(element));
        continue;
      }
      TableReader reader(*table, element_path, diag_);
      read(reader);
      reader.finish();
    }
  }

  // The required `name` of an entry: its characters, and no earlier entry of the same kind
  // with that name. `index` is the entry's position in its Config vector.
  void readName(TableReader& r, std::string_view kind, NameIndex& names, size_t index,
                std::string* out) {
    const toml::node* node = r.node("name");
    if (!node) return r.missing("name");
    const auto name = readString(*node, r.keyPath("name"), diag_);
    if (!name) return;
    *out = *name;
    if (name->empty()) {
      r.error("name", "must not be empty");
    } else if (!isName(*name)) {
      r.error("name", std::string(kind) + " name " + quoted(*name) +
                          " may only hold letters, digits, '_', '.' and '-'");
    }
    const int line = positionOf(node->source()).line;
    auto [it, inserted] = names.entries.emplace(*name, NameIndex::Entry{index, line});
    if (inserted) {
      names.names.push_back(*name);
    } else {
      r.error("name", "duplicate " + std::string(kind) + " name " + quoted(*name) +
                          " (first defined at line " + std::to_string(it->second.line) + ")");
    }
  }

  // A file the server opens later (certificate, key, CA bundle). Relative paths are relative
  // to the current directory, as the process will see them.
  std::optional<std::string> readFile(TableReader& r, std::string_view key, bool required,
                                      bool check = true) {
    const toml::node* node = r.node(key);
    if (!node) {
      if (required) r.missing(key);
      return std::nullopt;
    }
    auto path = readString(*node, r.keyPath(key), diag_);
    if (!path) return std::nullopt;
    if (path->empty()) {
      r.error(key, "must not be empty");
    } else if (auto why = check ? unreadableFile(*path) : std::nullopt) {
      r.error(key, "cannot read " + quoted(*path) + ": " + *why);
    }
    return path;
  }

  void loadServer(TableReader& r) {
    ServerConfig& s = config_.server;
    if (auto v = r.address("listen", AddressUse::Listen)) s.listen = *v;
    if (auto v = r.integer("workers", 0, 1024)) s.workers = static_cast<int>(*v);
    if (auto v = r.integer("max_request_header_bytes", 1024, 8 << 20)) {
      s.max_request_header_bytes = static_cast<size_t>(*v);
    }
    if (auto v = r.integer("max_request_body_bytes", 0, kNoMax)) {
      s.max_request_body_bytes = static_cast<size_t>(*v);
    }
    if (auto v = r.duration("request_header_timeout", false)) s.request_header_timeout = *v;
    if (auto v = r.duration("idle_timeout", false)) s.idle_timeout = *v;
    // Zero is meaningful here: stop without waiting for requests in flight.
    if (auto v = r.duration("drain_timeout", true)) s.drain_timeout = *v;
    if (auto v = r.enumeration<RateLimitHeaders>("rate_limit_headers",
                                                 {{"ietf", RateLimitHeaders::Ietf},
                                                  {"legacy", RateLimitHeaders::Legacy},
                                                  {"both", RateLimitHeaders::Both},
                                                  {"none", RateLimitHeaders::None}})) {
      s.rate_limit_headers = *v;
    }
    section(r, "tls", [&](TableReader& t) {
      ServerTlsConfig tls;
      readCertificate(t, &tls.default_certificate);
      if (auto v = t.duration("handshake_timeout", false)) tls.handshake_timeout = *v;
      entries(t, "certificates",
              [&](TableReader& c) { readCertificate(c, &tls.sni_certificates.emplace_back()); });
      s.tls = std::move(tls);
    });
  }

  void readCertificate(TableReader& r, TlsCertificate* out) {
    if (auto v = readFile(r, "cert", true)) out->cert_path = *v;
    if (auto v = readFile(r, "key", true)) out->key_path = *v;
  }

  void loadLog(TableReader& r) {
    if (auto v = r.enumeration<LogLevel>("level", {{"error", LogLevel::Error},
                                                   {"warn", LogLevel::Warn},
                                                   {"info", LogLevel::Info},
                                                   {"debug", LogLevel::Debug}})) {
      config_.log.level = *v;
    }
    if (auto v = r.enumeration<LogFormat>("format",
                                          {{"text", LogFormat::Text}, {"json", LogFormat::Json}})) {
      config_.log.format = *v;
    }
    if (auto v = r.string("access_log")) {
      if (v->empty()) r.error("access_log", "must not be empty (use \"off\" to disable it)");
      config_.log.access_log = *v;
    }
  }

  void loadValkey(TableReader& r) {
    ValkeyConfig& v = config_.valkey;
    if (auto a = r.address("address", AddressUse::Valkey)) v.address = *a;
    if (auto nodes = r.strings("nodes")) {
      if (r.node("nodes")->as_array()->empty()) {
        r.error("nodes", "must list at least one node (or use address)");
      }
      for (const StringItem& item : *nodes) {
        if (auto a = readAddress(*item.node, item.path, AddressUse::Valkey, diag_)) {
          v.nodes.push_back(*a);
        }
      }
      if (r.has("address")) r.error("nodes", "set either address or nodes, not both");
    }
    if (auto name = r.string("password_env")) {
      if (!isEnvironmentName(*name)) {
        r.error("password_env",
                "expected the name of an environment variable, such as "
                "\"VALKEY_PASSWORD\" (never the password itself)");
      }
      v.password_env = *name;
    }
    if (auto d = r.duration("timeout", false)) v.timeout = *d;
    if (auto d = r.duration("connect_timeout", false)) v.connect_timeout = *d;
    if (auto prefix = r.string("key_prefix")) {
      if (prefix->empty() || hasSpaceOrControl(*prefix)) {
        r.error("key_prefix", "must be non-empty, without spaces or control characters");
      }
      v.key_prefix = *prefix;
    }
  }

  void loadIdentity(TableReader& r) {
    IdentityConfig& id = config_.identity;
    if (auto items = r.strings("trusted_proxies")) {
      for (const StringItem& item : *items) {
        if (auto cidr = Cidr::parse(item.value)) {
          id.trusted_proxies.push_back(*cidr);
        } else {
          diag_.add(*item.node, item.path,
                    "bad CIDR " + quoted(item.value) +
                        ": expected an address or address/bits, such as \"10.0.0.0/8\"");
        }
      }
    }
    if (auto v = r.integer("ipv6_prefix", 1, 128)) id.ipv6_prefix = static_cast<int>(*v);
    if (auto v = r.string("api_key_header")) {
      if (!isToken(*v)) r.error("api_key_header", "not a valid header name: " + quoted(*v));
      id.api_key_header = *v;
    }
    if (auto v = r.string("session_cookie")) {
      if (!isToken(*v)) r.error("session_cookie", "not a valid cookie name: " + quoted(*v));
      id.session_cookie = *v;
    }
    if (auto v = r.boolean("reject_unknown_api_keys")) id.reject_unknown_api_keys = *v;
    if (auto v = r.boolean("valkey_tenants")) id.valkey_tenants = *v;
    // Zero is meaningful here: do not cache tenants looked up in Valkey.
    if (auto v = r.duration("tenant_cache_ttl", true)) id.tenant_cache_ttl = *v;
    if (auto v = r.string("tenant_key_prefix")) {
      if (v->empty() || hasSpaceOrControl(*v)) {
        r.error("tenant_key_prefix", "must be non-empty, without spaces or control characters");
      }
      id.tenant_key_prefix = *v;
    }
  }

  void loadUpstream(TableReader& r) {
    UpstreamConfig& u = config_.upstreams.emplace_back();
    readName(r, "upstream", upstreams_, config_.upstreams.size() - 1, &u.name);
    if (auto items = r.strings("endpoints")) {
      if (r.node("endpoints")->as_array()->empty()) r.error("endpoints", "must not be empty");
      for (const StringItem& item : *items) {
        if (auto a = readAddress(*item.node, item.path, AddressUse::Upstream, diag_)) {
          u.endpoints.push_back(*a);
        }
      }
    } else if (!r.has("endpoints")) {
      r.missing("endpoints");
    }
    if (auto v = r.duration("connect_timeout", false)) u.connect_timeout = *v;
    if (auto v = r.duration("response_timeout", false)) u.response_timeout = *v;
    if (auto v = r.duration("idle_timeout", false)) u.idle_timeout = *v;
    // Zero is meaningful here: never skip an endpoint that failed.
    if (auto v = r.duration("fail_timeout", true)) u.fail_timeout = *v;
    if (auto v = r.integer("max_idle_connections", 0, 100000)) {
      u.max_idle_connections = static_cast<size_t>(*v);
    }

    // The tls_* keys only mean something with tls = true; without it they are reported rather
    // than ignored, and their files are not looked at.
    const auto enabled = r.boolean("tls");
    const bool tls_on = enabled.value_or(false);
    if (!tls_on && (!r.has("tls") || enabled.has_value())) {
      for (std::string_view key :
           {"tls_server_name", "tls_ca_file", "tls_verify", "tls_client_cert", "tls_client_key"}) {
        if (r.has(key)) r.error(key, "has no effect without tls = true");
      }
    }
    UpstreamTlsConfig tls;
    if (auto v = r.string("tls_server_name")) {
      tls.server_name = lowerCase(*v);
      if (!isHostName(*v)) r.error("tls_server_name", "not a host name: " + quoted(*v));
    }
    if (auto v = readFile(r, "tls_ca_file", false, tls_on)) tls.ca_file = *v;
    if (auto v = r.boolean("tls_verify")) tls.verify = *v;
    const auto cert = readFile(r, "tls_client_cert", false, tls_on);
    const auto key = readFile(r, "tls_client_key", false, tls_on);
    if (cert && !key) r.error("tls_client_cert", "tls_client_key is needed too");
    if (key && !cert) r.error("tls_client_key", "tls_client_cert is needed too");
    tls.client_cert = cert.value_or("");
    tls.client_key = key.value_or("");
    if (tls_on) u.tls = std::move(tls);
  }

  void loadLimit(TableReader& r) {
    LimitConfig& l = config_.limits.emplace_back();
    readName(r, "limit", limits_, config_.limits.size() - 1, &l.name);
    if (auto v =
            r.enumeration<Algorithm>("algorithm", {{"fixed_window", Algorithm::FixedWindow},
                                                   {"sliding_log", Algorithm::SlidingLog},
                                                   {"sliding_window", Algorithm::SlidingWindow},
                                                   {"token_bucket", Algorithm::TokenBucket}})) {
      l.algorithm = *v;
    }
    if (auto items = r.strings("by")) {
      if (r.node("by")->as_array()->empty()) {
        r.error("by", "must name at least one key part, such as [\"ip\"]");
      }
      for (const StringItem& item : *items) readKeyPart(item, l);
    } else if (!r.has("by")) {
      r.missing("by");
    }
    const auto limit = r.integer("limit", 1, kMaxCount);
    if (limit) l.limit = *limit;
    if (!r.has("limit")) r.missing("limit");
    if (auto v = r.duration("window", false)) l.window = *v;
    if (!r.has("window")) r.missing("window");
    const auto burst = r.integer("burst", 1, kMaxCount);
    l.burst = burst.value_or(l.limit);
    // Written, even if wrong: a plan then leaves the capacity to this burst, and loadPlan()
    // does not add a second, derived error to the one reported here.
    l.burst_explicit = r.has("burst");
    const auto cost = r.integer("cost", 1, kMaxCount);
    if (cost) l.cost = *cost;
    l.count_denied = l.algorithm == Algorithm::SlidingLog;
    if (auto v = r.boolean("count_denied")) l.count_denied = *v;
    if (auto v = r.enumeration<OnError>("on_error",
                                        {{"allow", OnError::Allow}, {"deny", OnError::Deny}})) {
      l.on_error = *v;
    }
    if (auto v = r.boolean("shadow")) l.shadow = *v;

    // Known only when both values were read without error, to avoid a second, derived error.
    const bool bucket = l.algorithm == Algorithm::TokenBucket;
    const bool capacity_known = bucket ? (burst || (!r.has("burst") && limit)) : limit.has_value();
    if (cost && capacity_known && *cost > (bucket ? l.burst : l.limit)) {
      r.error("cost", "cost " + std::to_string(*cost) + " is above the capacity of the limit (" +
                          (bucket ? "burst = " + std::to_string(l.burst)
                                  : "limit = " + std::to_string(l.limit)) +
                          "): no request could ever pass");
    }
  }

  void readKeyPart(const StringItem& item, LimitConfig& l) {
    static const std::vector<std::pair<std::string, KeyPartKind>> kSimple = {
        {"ip", KeyPartKind::Ip},           {"api_key", KeyPartKind::ApiKey},
        {"session", KeyPartKind::Session}, {"tenant", KeyPartKind::Tenant},
        {"route", KeyPartKind::Route},     {"method", KeyPartKind::Method}};
    static const std::vector<std::pair<std::string, KeyPartKind>> kNamed = {
        {"header", KeyPartKind::Header},
        {"cookie", KeyPartKind::Cookie},
        {"query", KeyPartKind::Query},
        {"form", KeyPartKind::Form},
        {"json", KeyPartKind::Json}};
    const std::string& text = item.value;
    auto fail = [&](std::string message) { diag_.add(*item.node, item.path, std::move(message)); };
    auto lookup = [](const auto& table, std::string_view name) -> std::optional<KeyPartKind> {
      for (const auto& [candidate, kind] : table) {
        if (candidate == name) return kind;
      }
      return std::nullopt;
    };
    const auto colon = text.find(':');
    const std::string prefix = text.substr(0, colon);
    KeyPart part{KeyPartKind::Ip, "", text};
    std::optional<KeyPartKind> kind;
    if (colon == std::string::npos) {
      kind = lookup(kSimple, text);
      if (!kind && lookup(kNamed, text)) {
        return fail(quoted(text) + " needs a name: " + text + ":NAME");
      }
    } else {
      kind = lookup(kNamed, prefix);
      part.name = text.substr(colon + 1);
    }
    if (!kind) {
      std::vector<std::string> choices;
      for (const auto& entry : kSimple) choices.push_back(entry.first);
      for (const auto& entry : kNamed) choices.push_back(entry.first);
      return fail("unknown key part " + quoted(text) +
                  " (expected ip, api_key, session, tenant, route, method, header:NAME, "
                  "cookie:NAME, query:NAME, form:FIELD or json:FIELD)" +
                  didYouMean(prefix, choices));
    }
    part.kind = *kind;
    if (colon != std::string::npos) {
      if (part.name.empty()) return fail(quoted(text) + " needs a name after the ':'");
      const bool token_only = part.kind == KeyPartKind::Header || part.kind == KeyPartKind::Cookie;
      if (token_only && !isToken(part.name)) {
        return fail(quoted(part.name) + " is not a valid " + prefix + " name");
      }
      if (hasSpaceOrControl(part.name)) {
        return fail(quoted(part.name) + " has spaces or control characters");
      }
      // Header names are case-insensitive; the request side compares them in lower case.
      if (part.kind == KeyPartKind::Header) part.name = lowerCase(part.name);
    }
    for (const KeyPart& earlier : l.by) {
      if (earlier.kind == part.kind && earlier.name == part.name) {
        return fail("key part " + quoted(text) + " is repeated");
      }
    }
    l.by.push_back(std::move(part));
  }

  void loadRoute(TableReader& r) {
    RouteConfig& route = config_.routes.emplace_back();
    readName(r, "route", routes_, config_.routes.size() - 1, &route.name);
    // Routes match in order, so one after a route without conditions can never be chosen.
    if (catch_all_line_ > 0) {
      diag_.add(r.position(), r.path(),
                "unreachable: the route at line " + std::to_string(catch_all_line_) +
                    " has no match conditions and takes every request");
    }
    const toml::node* match = r.node("match");
    if (!match || (match->is_table() && match->as_table()->empty())) {
      if (catch_all_line_ == 0) catch_all_line_ = r.position().line;
    }
    if (const toml::node* node = match) {
      if (const toml::table* table = node->as_table()) {
        TableReader m(*table, r.keyPath("match"), diag_);
        readMatch(m, route.match);
        m.finish();
      } else {
        diag_.add(*node, r.keyPath("match"),
                  "expected a table such as { path_prefix = \"/api/\" }, got " + describe(*node));
      }
    }
    if (auto name = r.string("upstream")) {
      route.upstream = *name;
      if (const auto* entry = upstreams_.find(*name)) {
        route.upstream_index = entry->index;
      } else {
        r.error("upstream",
                "unknown upstream " + quoted(*name) + didYouMean(*name, upstreams_.names));
      }
    } else if (!r.has("upstream")) {
      r.missing("upstream");
    }
    if (auto items = r.strings("limits")) {
      for (const StringItem& item : *items) {
        const auto* entry = limits_.find(item.value);
        if (!entry) {
          diag_.add(*item.node, item.path,
                    "unknown limit " + quoted(item.value) + didYouMean(item.value, limits_.names));
        } else if (std::find(route.limits.begin(), route.limits.end(), item.value) !=
                   route.limits.end()) {
          diag_.add(*item.node, item.path, "limit " + quoted(item.value) + " is listed twice");
        } else {
          route.limits.push_back(item.value);
          route.limit_indices.push_back(entry->index);
        }
      }
    }
    if (auto v = r.integer("max_buffered_body_bytes", 0, 64 << 20)) {
      route.max_buffered_body_bytes = static_cast<size_t>(*v);
    }
  }

  void readMatch(TableReader& m, RouteMatch& match) {
    auto readPath = [&](std::string_view key, std::string* out) {
      auto v = m.string(key);
      if (!v) return;
      if (v->empty() || (*v)[0] != '/') {
        m.error(key, "must start with '/', got " + quoted(*v));
      } else if (hasSpaceOrControl(*v) || v->find_first_of("?#") != std::string::npos) {
        m.error(key, "must be a path without spaces, control characters, '?' or '#'");
      }
      *out = *v;
    };
    readPath("path_prefix", &match.path_prefix);
    readPath("path", &match.path);
    if (m.has("path") && m.has("path_prefix")) {
      m.error("path", "set either path (exact) or path_prefix, not both");
    }
    if (auto v = m.string("host")) {
      match.host = lowerCase(*v);
      const bool ipv6 = v->size() > 2 && v->front() == '[' && v->back() == ']';
      if (!ipv6 && !isHostName(*v)) {
        m.error("host", "expected a host name without port, got " + quoted(*v));
      }
    }
    if (auto items = m.strings("methods")) {
      for (const StringItem& item : *items) {
        std::string method = upperCase(item.value);
        if (!isToken(method)) {
          diag_.add(*item.node, item.path, "not a valid HTTP method: " + quoted(item.value));
        } else if (std::find(match.methods.begin(), match.methods.end(), method) !=
                   match.methods.end()) {
          diag_.add(*item.node, item.path, "method " + quoted(method) + " is listed twice");
        } else {
          match.methods.push_back(std::move(method));
        }
      }
    }
  }

  void loadPlan(TableReader& r) {
    PlanConfig& plan = config_.plans.emplace_back();
    readName(r, "plan", plans_, config_.plans.size() - 1, &plan.name);
    const toml::node* node = r.node("limits");
    if (!node) return;
    const toml::table* table = node->as_table();
    if (!table) {
      r.error("limits", "expected a table such as { per_key = 10000 }, got " + describe(*node));
      return;
    }
    // The keys of this table are limit names, so an unknown one is an unknown limit.
    for (const auto& [key, value] : *table) {
      const std::string name(key.str());
      const std::string path = r.keyPath("limits") + "." + name;
      const auto* entry = limits_.find(name);
      if (!entry) {
        diag_.add(positionOf(key.source()), path,
                  "unknown limit " + quoted(name) + didYouMean(name, limits_.names));
        continue;
      }
      PlanLimitOverride override;
      std::optional<int64_t> limit;
      // The value that sets the capacity, where a cost above it is reported.
      const toml::node* capacity_node = &value;
      std::string capacity_path = path;
      if (const toml::table* detail = value.as_table()) {
        TableReader d(*detail, path, diag_);
        limit = d.integer("limit", 1, kMaxCount);
        if (!d.has("limit")) d.missing("limit");
        override.burst = d.integer("burst", 1, kMaxCount);
        const bool by_burst =
            override.burst && config_.limits[entry->index].algorithm == Algorithm::TokenBucket;
        if (limit || by_burst) {
          capacity_node = d.node(by_burst ? "burst" : "limit");
          capacity_path = d.keyPath(by_burst ? "burst" : "limit");
        }
        d.finish();
      } else if (value.is_integer()) {
        limit = readInteger(value, path, 1, kMaxCount, diag_);
      } else {
        diag_.add(
            value, path,
            "expected a limit (an integer) or { limit = N, burst = M }, got " + describe(value));
      }
      if (!limit) continue;
      override.limit = *limit;
      // Same rule as on the limit itself: a cost above the capacity never passes. A token
      // bucket's capacity under a plan is the plan's burst, else the limit's written burst
      // (already checked against the cost in loadLimit()), else the plan's limit, which an
      // implicit burst follows (see ratelimit/applied_limits.cc). Limits are read before plans
      // whatever their order in the file, so the limit's burst is known here.
      const LimitConfig& l = config_.limits[entry->index];
      const bool bucket = l.algorithm == Algorithm::TokenBucket;
      const bool follows_limit = bucket && !override.burst && !l.burst_explicit;
      const std::optional<int64_t> capacity =
          bucket ? (follows_limit ? override.limit : override.burst) : override.limit;
      if (capacity && l.cost > *capacity) {
        diag_.add(*capacity_node, capacity_path,
                  "below the cost of limit " + quoted(name) + " (cost = " + std::to_string(l.cost) +
                      "): no request could ever pass" +
                      (follows_limit ? " (the bucket's capacity is this limit, as neither the "
                                       "limit nor the plan sets a burst)"
                                     : ""));
      }
      plan.limits[name] = override;
    }
  }

  void loadTenant(TableReader& r) {
    TenantConfig& tenant = config_.tenants.emplace_back();
    readName(r, "tenant", tenants_, config_.tenants.size() - 1, &tenant.name);
    if (auto plan = r.string("plan")) {
      tenant.plan = *plan;
      if (!plans_.find(*plan)) {
        r.error("plan", "unknown plan " + quoted(*plan) + didYouMean(*plan, plans_.names));
      }
    }
    if (auto items = r.strings("api_keys")) {
      for (const StringItem& item : *items) {
        // The key itself is never echoed: error output ends up in logs and CI transcripts.
        if (item.value.empty()) {
          diag_.add(*item.node, item.path, "an API key must not be empty");
          continue;
        }
        if (hasSpaceOrControl(item.value)) {
          diag_.add(*item.node, item.path,
                    "an API key cannot hold spaces or control characters (it travels in a "
                    "header)");
          continue;
        }
        auto [it, inserted] =
            api_keys_.emplace(item.value, ApiKeyOwner{config_.tenants.size() - 1, tenant.name,
                                                      positionOf(item.node->source()).line});
        if (!inserted) {
          const ApiKeyOwner& owner = it->second;
          diag_.add(*item.node, item.path,
                    (owner.tenant_index == config_.tenants.size() - 1
                         ? std::string("this API key is listed twice")
                         : "this API key already belongs to tenant " + quoted(owner.tenant)) +
                        " (line " + std::to_string(owner.line) + ")");
          continue;
        }
        tenant.api_keys.push_back(item.value);
        config_.tenant_by_api_key.emplace(item.value, config_.tenants.size() - 1);
      }
    }
  }

  Diagnostics& diag_;
  Config& config_;
  NameIndex upstreams_, limits_, routes_, plans_, tenants_;
  struct ApiKeyOwner {
    size_t tenant_index;
    std::string tenant;
    int line;
  };
  std::map<std::string, ApiKeyOwner> api_keys_;
  int catch_all_line_ = 0;  // of the first route that matches every request
};

// Reads a whole file; on failure says why (strerror) in *error.
bool readWholeFile(const std::string& path, std::string* out, std::string* error) {
  FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) {
    *error = errnoMessage(errno);
    return false;
  }
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0 && out->size() <= kMaxFileBytes) {
    out->append(buffer, n);
  }
  const int read_errno = errno;
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) {
    *error = errnoMessage(read_errno);
    return false;
  }
  if (out->size() > kMaxFileBytes) {
    *error = "larger than " + std::to_string(kMaxFileBytes >> 20) + " MiB";
    return false;
  }
  return true;
}

}  // namespace

LoadResult loadConfigString(std::string_view toml, const std::string& source_name) {
  LoadResult result;
  try {
    Diagnostics diag(source_name);
    auto config = std::make_shared<Config>();
    config->source_path = source_name;
    // Defaults that config.h cannot spell as member initializers.
    std::string unused;
    config->server.listen = *parseSocketAddress("0.0.0.0:8080", false, &unused);
    config->admin.listen = *parseSocketAddress("127.0.0.1:9901", false, &unused);
    try {
      const toml::table root = toml::parse(toml, std::string_view(source_name));
      Loader(diag, *config).load(root);
      resolveSharedQuotas(*config);
    } catch (const toml::parse_error& e) {
      diag.add(positionOf(e.source()), "", std::string(e.description()));
    }
    result.errors = std::move(diag).sorted();
    if (result.errors.empty()) result.config = std::move(config);
  } catch (const std::exception& e) {
    result.config.reset();
    result.errors.push_back(
        ConfigError{source_name, 0, 0, "", std::string("internal error: ") + e.what()});
  }
  return result;
}

LoadResult loadConfigFile(const std::string& path) {
  try {
    std::string text, error;
    if (!readWholeFile(path, &text, &error)) {
      LoadResult result;
      result.errors.push_back(ConfigError{path, 0, 0, "", "cannot read: " + error});
      return result;
    }
    return loadConfigString(text, path);
  } catch (const std::exception& e) {
    LoadResult result;
    result.errors.push_back(
        ConfigError{path, 0, 0, "", std::string("internal error: ") + e.what()});
    return result;
  }
}

}  // namespace sluice::config
