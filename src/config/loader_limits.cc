#include <algorithm>
#include <string>
#include <utility>

#include "config/loader_sections.h"

namespace sluice::config::loader_internal {

namespace {

// A sliding_log's limit beyond kMaxLogLimit: why it is refused.
std::string logLimitTooLarge(int64_t limit) {
  return "limit " + std::to_string(limit) + " is too large for algorithm = \"sliding_log\", " +
         "which keeps about 10 bytes per request in its window: at most " +
         std::to_string(kMaxLogLimit) + " (sliding_window counts any limit in 20 bytes)";
}

}  // namespace

// [[limit]] (with its key parts), [[plan]] and [[tenant]].

void Loader::loadLimit(TableReader& r) {
  LimitConfig& l = config_.limits.emplace_back();
  readName(r, "limit", limits_, config_.limits.size() - 1, &l.name);
  if (auto v = r.enumeration<Algorithm>("algorithm", {{"fixed_window", Algorithm::FixedWindow},
                                                      {"sliding_log", Algorithm::SlidingLog},
                                                      {"sliding_window", Algorithm::SlidingWindow},
                                                      {"token_bucket", Algorithm::TokenBucket},
                                                      {"concurrency", Algorithm::Concurrency}})) {
    l.algorithm = *v;
  }
  const bool concurrency = l.algorithm == Algorithm::Concurrency;
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
  if (limit && l.algorithm == Algorithm::SlidingLog && *limit > kMaxLogLimit) {
    r.error("limit", logLimitTooLarge(*limit));
  }
  if (concurrency) {
    // No window: a slot is held while its request lasts. Its lease is what the script keeps
    // as the window of the limit's definition.
    for (const char* key : {"window", "burst", "count_denied", "cost"}) {
      if (r.has(key)) {
        r.error(key, std::string("does not apply to algorithm = \"concurrency\" (a slot is held "
                                 "while its request lasts; see lease)"));
      }
    }
    if (auto v = r.duration("lease", false)) l.lease = *v;
    if (l.lease.count() < 1000) {
      r.error("lease", "must be at least 1s (the gateway renews it a few times per lease)");
    }
    l.window = l.lease;
  } else {
    if (r.has("lease")) {
      r.error("lease", "applies only to algorithm = \"concurrency\"");
    }
    if (auto v = r.duration("window", false)) l.window = *v;
    if (!r.has("window")) r.missing("window");
  }
  const auto burst = r.integer("burst", 1, kMaxCount);
  l.burst = burst.value_or(l.limit);
  // Written, even if wrong: a plan then leaves the capacity to this burst, and loadPlan()
  // does not add a second, derived error to the one reported here.
  l.burst_explicit = r.has("burst");
  const auto cost = r.integer("cost", 1, kMaxCount);
  if (cost) l.cost = *cost;
  l.count_denied = l.algorithm == Algorithm::SlidingLog;
  if (auto v = r.boolean("count_denied"); v && !concurrency) l.count_denied = *v;
  if (auto v = r.enumeration<OnError>("on_error",
                                      {{"allow", OnError::Allow}, {"deny", OnError::Deny}})) {
    l.on_error = *v;
  }
  if (auto v = r.boolean("shadow")) l.shadow = *v;
  if (auto v = r.string("cost_from")) readCostFrom(r, *v, l);
  readOnMissingAndFold(r, l);

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

// on_missing and fold, once `by` is read (fold applies to the parts it names).
void Loader::readOnMissingAndFold(TableReader& r, LimitConfig& l) {
  using Kind = KeyPartKind;
  // The default is the contract's (PRODUCT.md: a limit whose key part is absent does not apply
  // to that request), for every kind of part; each such request is counted (outcome
  // "skipped"), so a limit side-stepped this way shows. A login route sets "deny".
  l.on_missing = OnMissing::Skip;
  if (auto v = r.enumeration<OnMissing>(
          "on_missing",
          {{"skip", OnMissing::Skip}, {"deny", OnMissing::Deny}, {"shared", OnMissing::Shared}})) {
    l.on_missing = *v;
  }
  enum class Fold { None, Lower };
  const auto fold = r.enumeration<Fold>("fold", {{"none", Fold::None}, {"lower", Fold::Lower}});
  if (fold != Fold::Lower) return;
  bool folds = false;
  for (KeyPart& part : l.by) {
    // Values a client writes; ip (canonical text), route, method and tenant (names) keep theirs.
    part.fold_lower = part.kind != Kind::Ip && part.kind != Kind::Route &&
                      part.kind != Kind::Method && part.kind != Kind::Tenant;
    folds = folds || part.fold_lower;
  }
  if (!folds && !l.by.empty()) {
    r.error("fold",
            "none of the parts of `by` is a value a client writes (ip, route, method "
            "and tenant are never folded)");
  }
}

// cost_from = "response_header:NAME" (the only source so far).
void Loader::readCostFrom(TableReader& r, const std::string& text, LimitConfig& l) {
  static constexpr std::string_view kPrefix = "response_header:";
  if (text.rfind(kPrefix, 0) != 0 || !isToken(text.substr(kPrefix.size()))) {
    r.error("cost_from",
            "expected \"response_header:NAME\" (NAME: a header field name), got " + inQuotes(text));
    return;
  }
  if (l.algorithm != Algorithm::FixedWindow && l.algorithm != Algorithm::SlidingWindow &&
      l.algorithm != Algorithm::TokenBucket) {
    r.error("cost_from",
            "applies to fixed_window, sliding_window and token_bucket (a cost known only after "
            "the response cannot be kept in a log or as slots)");
    return;
  }
  l.cost_from_header = lowerCase(text.substr(kPrefix.size()));
}

void Loader::readKeyPart(const StringItem& item, LimitConfig& l) {
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
      return fail(inQuotes(text) + " needs a name: " + text + ":NAME");
    }
  } else {
    kind = lookup(kNamed, prefix);
    part.name = text.substr(colon + 1);
  }
  if (!kind) {
    std::vector<std::string> choices;
    for (const auto& entry : kSimple) choices.push_back(entry.first);
    for (const auto& entry : kNamed) choices.push_back(entry.first);
    return fail("unknown key part " + inQuotes(text) +
                " (expected ip, api_key, session, tenant, route, method, header:NAME, "
                "cookie:NAME, query:NAME, form:FIELD or json:FIELD)" +
                didYouMean(prefix, choices));
  }
  part.kind = *kind;
  if (colon != std::string::npos) {
    if (part.name.empty()) return fail(inQuotes(text) + " needs a name after the ':'");
    const bool token_only = part.kind == KeyPartKind::Header || part.kind == KeyPartKind::Cookie;
    if (token_only && !isToken(part.name)) {
      return fail(inQuotes(part.name) + " is not a valid " + prefix + " name");
    }
    if (hasSpaceOrControl(part.name)) {
      return fail(inQuotes(part.name) + " has spaces or control characters");
    }
    // Header names are case-insensitive; the request side compares them in lower case.
    if (part.kind == KeyPartKind::Header) part.name = lowerCase(part.name);
  }
  for (const KeyPart& earlier : l.by) {
    if (earlier.kind == part.kind && earlier.name == part.name) {
      return fail("key part " + inQuotes(text) + " is repeated");
    }
  }
  l.by.push_back(std::move(part));
}

void Loader::loadPlan(TableReader& r) {
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
                "unknown limit " + inQuotes(name) + didYouMean(name, limits_.names));
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
    if (config_.limits[entry->index].algorithm == Algorithm::SlidingLog && *limit > kMaxLogLimit) {
      const toml::table* detail = value.as_table();
      diag_.add(detail ? *detail->get("limit") : value, detail ? path + ".limit" : path,
                logLimitTooLarge(*limit));
      continue;
    }
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
                "below the cost of limit " + inQuotes(name) + " (cost = " + std::to_string(l.cost) +
                    "): no request could ever pass" +
                    (follows_limit ? " (the bucket's capacity is this limit, as neither the "
                                     "limit nor the plan sets a burst)"
                                   : ""));
    }
    plan.limits[name] = override;
  }
}

void Loader::loadTenant(TableReader& r) {
  TenantConfig& tenant = config_.tenants.emplace_back();
  readName(r, "tenant", tenants_, config_.tenants.size() - 1, &tenant.name);
  if (auto plan = r.string("plan")) {
    tenant.plan = *plan;
    if (!plans_.find(*plan)) {
      r.error("plan", "unknown plan " + inQuotes(*plan) + didYouMean(*plan, plans_.names));
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
                       : "this API key already belongs to tenant " + inQuotes(owner.tenant)) +
                      " (line " + std::to_string(owner.line) + ")");
        continue;
      }
      tenant.api_keys.push_back(item.value);
      config_.tenant_by_api_key.emplace(item.value, config_.tenants.size() - 1);
    }
  }
}

}  // namespace sluice::config::loader_internal
