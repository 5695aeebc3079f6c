#include "config/ratelimit_yaml.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>

namespace sluice::config {

struct RateLimitYaml::Node {
  // Children by "key" or "key_value".
  std::unordered_map<std::string, std::unique_ptr<Node>> children;
  // Children whose value holds '*': the "key_value" pattern split at each '*', in load order.
  struct Wildcard {
    std::string key;
    std::vector<std::string> parts;
  };
  std::vector<Wildcard> wildcards;
  std::unique_ptr<ConfiguredLimit> limit;
  bool share_threshold = false;
  std::string wildcard_pattern;  // its "key_value*" when share_threshold
};

namespace {

using Node = RateLimitYaml::Node;

// The keys that service knows (config_impl.go validKeys); any other is refused, at any depth
// but under metadata.
constexpr std::array<std::string_view, 16> kValidKeys = {"domain",
                                                         "key",
                                                         "value",
                                                         "descriptors",
                                                         "rate_limit",
                                                         "unit",
                                                         "requests_per_unit",
                                                         "unlimited",
                                                         "shadow_mode",
                                                         "quota_mode",
                                                         "name",
                                                         "replaces",
                                                         "detailed_metric",
                                                         "value_to_metric",
                                                         "share_threshold",
                                                         "metadata"};

// What a plain scalar resolves to under YAML 1.1, as that service's YAML library (go-yaml v2)
// reads it: the config is refused or read by those types.
enum class Kind { Null, Bool, Int, Float, String };

bool isBoolWord(std::string_view s, bool& value) {
  static constexpr std::array<std::string_view, 11> kTrue = {
      "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE"};
  static constexpr std::array<std::string_view, 11> kFalse = {
      "n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE"};
  if (std::find(kTrue.begin(), kTrue.end(), s) != kTrue.end()) {
    value = true;
    return true;
  }
  if (std::find(kFalse.begin(), kFalse.end(), s) != kFalse.end()) {
    value = false;
    return true;
  }
  return false;
}

// An integer as Go's strconv with base 0 reads it once underscores are gone: an optional
// sign, then 0x hex, 0b binary, 0o or a leading 0 octal, or decimal.
std::optional<int64_t> parseYamlInt(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (c != '_') s.push_back(c);
  }
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i >= s.size()) return std::nullopt;
  int base = 10;
  if (s.size() - i > 1 && s[i] == '0') {
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i + 1])));
    if (p == 'x' || p == 'b' || p == 'o') {
      base = p == 'x' ? 16 : p == 'b' ? 2 : 8;
      i += 2;
    } else {
      base = 8;
      i += 1;
    }
    if (i >= s.size()) return std::nullopt;
  }
  uint64_t value = 0;
  for (; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    int digit;
    if (std::isdigit(c)) {
      digit = c - '0';
    } else if (std::isxdigit(c)) {
      digit = std::tolower(c) - 'a' + 10;
    } else {
      return std::nullopt;
    }
    if (digit >= base) return std::nullopt;
    if (value > (std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(digit)) /
                    static_cast<uint64_t>(base)) {
      return std::nullopt;
    }
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(digit);
  }
  if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return negative ? -static_cast<int64_t>(value) : static_cast<int64_t>(value);
}

bool isYamlFloat(std::string_view s) {
  static constexpr std::array<std::string_view, 12> kSpecial = {".inf",  ".Inf",  ".INF",  "+.inf",
                                                                "+.Inf", "+.INF", "-.inf", "-.Inf",
                                                                "-.INF", ".nan",  ".NaN",  ".NAN"};
  if (std::find(kSpecial.begin(), kSpecial.end(), s) != kSpecial.end()) return true;
  // [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i - from;
  };
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  } else {
    if (digits() == 0) return false;
    if (i < s.size() && s[i] == '.') {
      ++i;
      digits();
    }
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

Kind kindOf(const YAML::Node& node) {
  if (node.IsNull()) return Kind::Null;
  if (!node.IsScalar()) return Kind::String;
  const std::string& tag = node.Tag();
  if (tag == "!" || tag == "tag:yaml.org,2002:str") return Kind::String;  // quoted, or !!str
  const std::string& s = node.Scalar();
  bool ignored = false;
  if (isBoolWord(s, ignored)) return Kind::Bool;
  if (parseYamlInt(s)) return Kind::Int;
  if (isYamlFloat(s)) return Kind::Float;
  return Kind::String;
}

const char* yamlTypeName(const YAML::Node& node) {
  if (node.IsMap()) return "!!map";
  if (node.IsSequence()) return "!!seq";
  switch (kindOf(node)) {
    case Kind::Null:
      return "!!null";
    case Kind::Bool:
      return "!!bool";
    case Kind::Int:
      return "!!int";
    case Kind::Float:
      return "!!float";
    case Kind::String:
      break;
  }
  return "!!str";
}

class YamlLoader {
 public:
  explicit YamlLoader(const std::string& file) : file_(file) {}

  // The domain of the descriptors loaded next (their limits' paths begin with it).
  std::string domain;

  const std::string& error() const { return error_; }

  bool fail(const YAML::Mark& mark, const std::string& why) {
    error_ = file_;
    if (mark.line >= 0) {
      error_.append(":").append(std::to_string(mark.line + 1));
      error_.append(":").append(std::to_string(mark.column + 1));
    }
    error_.append(": ").append(why);
    return false;
  }

  // config_impl.go validateYamlKeys: every key a string that service knows, lists of maps
  // only, leaves of string, int, bool or null (a float is refused).
  bool validateKeys(const YAML::Node& map) {
    for (const auto& item : map) {
      const YAML::Node& key = item.first;
      const YAML::Node& value = item.second;
      if (!key.IsScalar() || kindOf(key) != Kind::String) {
        return fail(key.Mark(), "config error, key is not of type string: " + scalarText(key));
      }
      const std::string& name = key.Scalar();
      if (std::find(kValidKeys.begin(), kValidKeys.end(), name) == kValidKeys.end()) {
        return fail(key.Mark(), "config error, unknown key '" + name + "'");
      }
      if (name == "metadata") continue;  // free-form
      if (value.IsSequence()) {
        for (const auto& element : value) {
          if (!element.IsMap()) {
            return fail(element.Mark(),
                        "config error, yaml file contains list of type other than map: " +
                            scalarText(element));
          }
          if (!validateKeys(element)) return false;
        }
      } else if (value.IsMap()) {
        if (!validateKeys(value)) return false;
      } else if (kindOf(value) == Kind::Float) {
        return fail(value.Mark(), "error checking config");
      }
    }
    return true;
  }

  // The typed reads (that service's second unmarshal, into its structs).
  bool text(const YAML::Node& node, std::string_view field, std::string& out) {
    if (!node || node.IsNull()) {
      out.clear();
      return true;
    }
    if (!node.IsScalar()) return typeError(node, field, "string");
    out = node.Scalar();
    return true;
  }

  bool boolean(const YAML::Node& node, std::string_view field, bool& out) {
    out = false;
    if (!node || node.IsNull()) return true;
    if (!node.IsScalar() || kindOf(node) != Kind::Bool) return typeError(node, field, "bool");
    isBoolWord(node.Scalar(), out);
    return true;
  }

  bool uint32Field(const YAML::Node& node, std::string_view field, uint32_t& out) {
    out = 0;
    if (!node || node.IsNull()) return true;
    if (!node.IsScalar() || kindOf(node) != Kind::Int) return typeError(node, field, "uint32");
    const int64_t value = *parseYamlInt(node.Scalar());
    if (value < 0 || value > std::numeric_limits<uint32_t>::max()) {
      return typeError(node, field, "uint32");
    }
    out = static_cast<uint32_t>(value);
    return true;
  }

  bool listField(const YAML::Node& node, std::string_view field) {
    if (!node || node.IsNull() || node.IsSequence()) return true;
    return typeError(node, field, "a list");
  }

  bool typeError(const YAML::Node& node, std::string_view field, std::string_view type) {
    return fail(node.Mark(), "error loading config file: cannot unmarshal " +
                                 std::string(yamlTypeName(node)) + " `" + scalarText(node) +
                                 "` into " + std::string(type) + " (" + std::string(field) + ")");
  }

  static std::string scalarText(const YAML::Node& node) {
    if (node.IsScalar()) return node.Scalar();
    if (node.IsNull()) return "null";
    return node.IsMap() ? "map" : "list";
  }

  std::string where(const YAML::Node& node) const {
    return file_ + ":" + std::to_string(node.Mark().line + 1);
  }

  // config_impl.go loadDescriptors: each descriptor of `list` under `parent`, whose stats
  // path is `path` ("domain." or "domain.key1_value1.").
  bool loadDescriptors(const YAML::Node& list, Node& parent, const std::string& path,
                       std::vector<const ConfiguredLimit*>& limits) {
    if (!list || list.IsNull()) return true;
    for (const auto& item : list) {
      std::string key;
      std::string value;
      if (!text(item["key"], "key", key) || !text(item["value"], "value", value)) return false;
      if (key.empty()) return fail(item.Mark(), "descriptor has empty key");
      const std::string final_key = value.empty() ? key : key + "_" + value;
      const std::string full_path = path + final_key;
      if (parent.children.count(final_key) != 0) {
        return fail(item.Mark(), "duplicate descriptor composite key '" + full_path + "'");
      }
      auto node = std::make_unique<Node>();
      bool shadow_mode = false;
      bool quota_mode = false;
      bool detailed_metric = false;
      bool value_to_metric = false;
      if (!boolean(item["shadow_mode"], "shadow_mode", shadow_mode) ||
          !boolean(item["quota_mode"], "quota_mode", quota_mode) ||
          !boolean(item["detailed_metric"], "detailed_metric", detailed_metric) ||
          !boolean(item["value_to_metric"], "value_to_metric", value_to_metric) ||
          !boolean(item["share_threshold"], "share_threshold", node->share_threshold)) {
        return false;
      }
      const YAML::Node rate_limit = item["rate_limit"];
      if (rate_limit && !rate_limit.IsNull()) {
        if (!rate_limit.IsMap()) return typeError(rate_limit, "rate_limit", "a map");
        auto limit = std::make_unique<ConfiguredLimit>();
        std::string unit;
        if (!boolean(rate_limit["unlimited"], "unlimited", limit->unlimited) ||
            !text(rate_limit["unit"], "unit", unit) ||
            !uint32Field(rate_limit["requests_per_unit"], "requests_per_unit",
                         limit->requests_per_unit) ||
            !text(rate_limit["name"], "name", limit->name) ||
            !listField(rate_limit["replaces"], "replaces")) {
          return false;
        }
        const std::optional<RateUnit> parsed = parseUnit(unit);
        if (limit->unlimited) {
          if (parsed) {
            return fail(rate_limit.Mark(), "should not specify rate limit unit when unlimited");
          }
        } else if (!parsed) {
          return fail(rate_limit.Mark(), "invalid rate limit unit '" + unit + "'");
        } else {
          limit->unit = *parsed;
        }
        if (const YAML::Node replaces = rate_limit["replaces"]; replaces) {
          for (const auto& entry : replaces) {
            std::string name;
            if (!text(entry["name"], "replaces.name", name)) return false;
            if (name.empty()) {
              return fail(entry.Mark(), "should not have an empty replaces entry");
            }
            if (name == limit->name) {
              return fail(entry.Mark(), "replaces should not contain name of same descriptor");
            }
            limit->replaces.push_back(std::move(name));
          }
        }
        limit->shadow_mode = shadow_mode;
        limit->quota_mode = quota_mode;
        limit->detailed_metric = detailed_metric;
        limit->path = full_path;
        limit->domain = domain;
        limit->where = where(rate_limit);
        limits.push_back(limit.get());
        node->limit = std::move(limit);
      }
      const bool wildcard = final_key.find('*') != std::string::npos;
      if (node->share_threshold && !wildcard) {
        return fail(item.Mark(),
                    "share_threshold can only be used with wildcard values (containing '*'), "
                    "but found key '" +
                        final_key + "'");
      }
      if (node->share_threshold) node->wildcard_pattern = final_key;
      if (wildcard) {
        Node::Wildcard entry{final_key, {}};
        size_t from = 0;
        for (size_t star = final_key.find('*'); star != std::string::npos;
             star = final_key.find('*', from)) {
          entry.parts.push_back(final_key.substr(from, star - from));
          from = star + 1;
        }
        entry.parts.push_back(final_key.substr(from));
        parent.wildcards.push_back(std::move(entry));
      }
      const YAML::Node nested = item["descriptors"];
      if (!listField(nested, "descriptors") ||
          !loadDescriptors(nested, *node, full_path + ".", limits)) {
        return false;
      }
      parent.children.emplace(final_key, std::move(node));
    }
    return true;
  }

 private:
  const std::string& file_;
  std::string error_;
};

constexpr std::array<std::string_view, 8> kUnitNames = {"UNKNOWN", "SECOND", "MINUTE", "HOUR",
                                                        "DAY",     "MONTH",  "YEAR",   "WEEK"};

// config_impl.go wildcardMatch: each '*' matches zero or more bytes.
bool wildcardMatch(const std::vector<std::string>& parts, std::string_view value) {
  if (parts.size() == 1) return parts[0] == value;
  const std::string& first = parts.front();
  const std::string& last = parts.back();
  size_t fixed = 0;
  for (const std::string& part : parts) fixed += part.size();
  if (value.size() < fixed) return false;
  if (value.substr(0, first.size()) != first) return false;
  if (value.substr(value.size() - last.size()) != last) return false;
  std::string_view rest = value.substr(first.size(), value.size() - first.size() - last.size());
  for (size_t i = 1; i + 1 < parts.size(); ++i) {
    const size_t at = rest.find(parts[i]);
    if (at == std::string_view::npos) return false;
    rest.remove_prefix(at + parts[i].size());
  }
  return true;
}

}  // namespace

std::optional<RateUnit> parseUnit(std::string_view name) {
  for (size_t i = 1; i < kUnitNames.size(); ++i) {
    const std::string_view known = kUnitNames[i];
    if (name.size() != known.size()) continue;
    bool same = true;
    for (size_t j = 0; j < name.size() && same; ++j) {
      same = std::toupper(static_cast<unsigned char>(name[j])) == known[j];
    }
    if (same) return static_cast<RateUnit>(i);
  }
  return std::nullopt;
}

std::string_view unitName(RateUnit unit) {
  const auto i = static_cast<size_t>(unit);
  return i < kUnitNames.size() ? kUnitNames[i] : kUnitNames[0];
}

uint64_t unitSeconds(RateUnit unit) {
  switch (unit) {
    case RateUnit::Second:
      return 1;
    case RateUnit::Minute:
      return 60;
    case RateUnit::Hour:
      return 3600;
    case RateUnit::Day:
      return 86'400;
    case RateUnit::Week:
      return 7 * 86'400;
    case RateUnit::Month:
      return 30 * 86'400;
    case RateUnit::Year:
      return 365 * 86'400;
    case RateUnit::Unknown:
      break;
  }
  return 0;
}

RateLimitYaml::RateLimitYaml() = default;
RateLimitYaml::~RateLimitYaml() = default;
RateLimitYaml::RateLimitYaml(RateLimitYaml&&) noexcept = default;
RateLimitYaml& RateLimitYaml::operator=(RateLimitYaml&&) noexcept = default;

bool RateLimitYaml::addFile(const std::string& file, std::string_view text, bool merge_domains,
                            std::string& error) {
  YamlLoader loader(file);
  YAML::Node loaded;
  try {
    loaded = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    loader.fail(e.mark, "error loading config file: " + e.msg);
    error = loader.error();
    return false;
  }
  // Read through a const handle: operator[] of a non-const node would add the key it looks up.
  const YAML::Node& root = loaded;
  try {
    if (root.IsDefined() && !root.IsNull() && !root.IsMap()) {
      loader.fail(root.Mark(), std::string("error loading config file: cannot unmarshal ") +
                                   yamlTypeName(root) + " into a map");
      error = loader.error();
      return false;
    }
    std::string domain;
    std::vector<const ConfiguredLimit*> limits;
    auto fresh = std::make_unique<Node>();
    const bool ok =
        (!root.IsMap() || loader.validateKeys(root)) &&
        (root.IsNull() || loader.text(root["domain"], "domain", domain)) &&
        (!domain.empty() || loader.fail(root.Mark(), "config file cannot have empty domain"));
    if (!ok) {
      error = loader.error();
      return false;
    }
    auto existing = domains_.find(domain);
    if (existing != domains_.end() && !merge_domains) {
      loader.fail(root["domain"].Mark(), "duplicate domain '" + domain + "' in config file");
      error = loader.error();
      return false;
    }
    const YAML::Node descriptors = root["descriptors"];
    loader.domain = domain;
    if (!loader.listField(descriptors, "descriptors") ||
        !loader.loadDescriptors(descriptors, *fresh, domain + ".", limits)) {
      error = loader.error();
      return false;
    }
    if (existing == domains_.end()) {
      domains_.emplace(domain, std::move(fresh));
    } else {
      // Merged: a composite key both define is refused, as that service refuses it.
      Node& into = *existing->second;
      for (const auto& [key, node] : fresh->children) {
        if (into.children.count(key) != 0) {
          loader.fail(descriptors.Mark(),
                      "duplicate descriptor composite key '" + domain + "." + key + "'");
          error = loader.error();
          return false;
        }
      }
      for (auto& [key, node] : fresh->children) into.children.emplace(key, std::move(node));
      for (auto& wildcard : fresh->wildcards) into.wildcards.push_back(std::move(wildcard));
    }
    limits_.insert(limits_.end(), limits.begin(), limits.end());
    return true;
  } catch (const YAML::Exception& e) {
    // A node of the wrong shape read as another (yaml-cpp's conversions): refused likewise.
    loader.fail(e.mark, "error loading config file: " + e.msg);
    error = loader.error();
    return false;
  }
}

bool RateLimitYaml::addDirectory(const std::string& dir, bool merge_domains, std::string& error) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".yaml" || ext == ".yml")) files.push_back(entry.path());
  }
  if (ec) {
    error = dir + ": cannot read the directory: " + ec.message();
    return false;
  }
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      error = path.string() + ": cannot read the file";
      return false;
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!addFile(path.string(), text, merge_domains, error)) return false;
  }
  return true;
}

std::vector<std::string> RateLimitYaml::domains() const {
  std::vector<std::string> out;
  out.reserve(domains_.size());
  for (const auto& entry : domains_) out.push_back(entry.first);
  return out;
}

bool RateLimitYaml::hasDomain(std::string_view domain) const {
  return domains_.find(domain) != domains_.end();
}

std::vector<const ConfiguredLimit*> RateLimitYaml::limits() const { return limits_; }

LimitMatch RateLimitYaml::find(std::string_view domain,
                               const std::vector<DescriptorEntry>& entries) const {
  LimitMatch match;
  auto found = domains_.find(domain);
  if (found == domains_.end()) return match;
  const Node* level = found->second.get();
  std::string final_key;
  for (size_t i = 0; i < entries.size(); ++i) {
    const DescriptorEntry& entry = entries[i];
    final_key.assign(entry.key).append("_").append(entry.value);
    const Node* next = nullptr;
    const std::string* wildcard_key = nullptr;
    if (auto it = level->children.find(final_key); it != level->children.end()) {
      next = it->second.get();
    } else {
      for (const Node::Wildcard& wildcard : level->wildcards) {
        if (wildcardMatch(wildcard.parts, final_key)) {
          next = level->children.at(wildcard.key).get();
          wildcard_key = &wildcard.key;
          break;
        }
      }
      if (!next) {
        if (auto it = level->children.find(entry.key); it != level->children.end()) {
          next = it->second.get();
        }
      }
    }
    if (!next) break;
    if (wildcard_key && next->share_threshold) {
      match.shared_values.resize(entries.size());
      // The pattern's value: after "key_" when it starts so (strings.TrimPrefix).
      std::string_view pattern = next->wildcard_pattern;
      if (pattern.size() > entry.key.size() && pattern.substr(0, entry.key.size()) == entry.key &&
          pattern[entry.key.size()] == '_') {
        pattern.remove_prefix(entry.key.size() + 1);
      }
      match.shared_values[i] = std::string(pattern);
    }
    if (next->limit && i + 1 == entries.size()) match.limit = next->limit.get();
    if (next->children.empty()) break;
    level = next;
  }
  if (!match.limit) match.shared_values.clear();
  return match;
}

}  // namespace sluice::config
