#include "config/loader_table_reader.h"

#include <algorithm>
#include <tuple>

#include "config/duration.h"

namespace sluice::config::loader_internal {

namespace {

bool isAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// Optimal string alignment distance, case-insensitive: a swapped pair of letters counts as one
// edit, the commonest typo after a missing or doubled letter.
size_t editDistance(std::string_view a_in, std::string_view b_in) {
  const std::string a = lowerCase(a_in), b = lowerCase(b_in);
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::vector<ConfigError> Diagnostics::sorted() && {
  std::stable_sort(errors_.begin(), errors_.end(), [](const auto& a, const auto& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  return std::move(errors_);
}

std::string inQuotes(std::string_view text) {
  // (Appended, not "'" + text + "'": GCC 12's -O3 sees a false -Wrestrict overlap in that.)
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('\'');
  out.append(text);
  out.push_back('\'');
  return out;
}

std::string lowerCase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  return out;
}

std::string upperCase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  return out;
}

bool isToken(std::string_view text) {
  static constexpr std::string_view kSymbols = "!#$%&'*+-.^_`|~";
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return isAlnum(c) || kSymbols.find(c) != std::string_view::npos;
  });
}

// Names of upstreams, limits, routes, plans and tenants end up in Valkey keys, metric labels
// and RateLimit headers, so they keep to characters that need no quoting in any of those.
bool isName(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return isAlnum(c) || c == '_' || c == '.' || c == '-';
  });
}

bool isHostName(std::string_view text) {
  return !text.empty() && text.size() <= 253 && std::all_of(text.begin(), text.end(), [](char c) {
    return isAlnum(c) || c == '-' || c == '.' || c == '_';
  });
}

bool hasSpaceOrControl(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u <= 0x20 || u == 0x7f;
  });
}

// A candidate that would have to be rewritten entirely ("x" for "ip") is no suggestion. One
// that is a prefix of the word, or the other way round, is: "warning" for "warn", "timeout_ms"
// for "timeout".
std::string didYouMean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_distance = 3;
  for (const std::string& candidate : candidates) {
    const size_t distance = editDistance(word, candidate);
    if (distance < best_distance && distance < candidate.size()) {
      best = &candidate;
      best_distance = distance;
    }
  }
  if (!best) {
    const std::string lower_word = lowerCase(word);
    for (const std::string& candidate : candidates) {
      const std::string lower = lowerCase(candidate);
      const bool prefix = lower.size() < lower_word.size()
                              ? lower_word.compare(0, lower.size(), lower) == 0
                              : lower.compare(0, lower_word.size(), lower_word) == 0;
      if (prefix && std::min(lower.size(), lower_word.size()) >= 4) {
        best = &candidate;
        break;
      }
    }
  }
  return best ? ", did you mean " + inQuotes(*best) + "?" : "";
}

std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::optional<std::string> readString(const toml::node& node, const std::string& path,
                                      Diagnostics& diag) {
  const auto* value = node.as_string();
  if (!value) {
    diag.add(node, path, "expected a string, got " + describe(node));
    return std::nullopt;
  }
  // Every string ends up in a C API (paths, addresses, header names) that would stop at a NUL
  // and silently use what comes before it.
  if (value->get().find('\0') != std::string::npos) {
    diag.add(node, path, "must not contain a NUL character");
    return std::nullopt;
  }
  return value->get();
}

std::optional<int64_t> readInteger(const toml::node& node, const std::string& path, int64_t min,
                                   int64_t max, Diagnostics& diag) {
  const auto* value = node.as_integer();
  if (!value) {
    diag.add(node, path, "expected an integer, got " + describe(node));
    return std::nullopt;
  }
  const int64_t v = value->get();
  if (v >= min && v <= max) return v;
  const std::string range =
      max == kNoMax ? "must be at least " + std::to_string(min)
                    : "must be between " + std::to_string(min) + " and " + std::to_string(max);
  diag.add(node, path, range + ", got " + std::to_string(v));
  return std::nullopt;
}

std::optional<bool> readBool(const toml::node& node, const std::string& path, Diagnostics& diag) {
  if (const auto* value = node.as_boolean()) return value->get();
  diag.add(node, path, "expected a boolean (true or false), got " + describe(node));
  return std::nullopt;
}

std::optional<Duration> readDuration(const toml::node& node, const std::string& path,
                                     bool allow_zero, Diagnostics& diag) {
  const auto* value = node.as_string();
  if (!value) {
    diag.add(node, path,
             "expected a duration string with a unit such as \"10s\", got " + describe(node));
    return std::nullopt;
  }
  const auto duration = parseDuration(value->get());
  if (!duration) {
    diag.add(node, path,
             "bad duration " + inQuotes(value->get()) +
                 ": expected a number and a unit (ms, s, m, h, d), such as \"250ms\" or \"10s\"");
    return std::nullopt;
  }
  if (!allow_zero && duration->count() == 0) {
    diag.add(node, path, "must be greater than zero");
    return std::nullopt;
  }
  return *duration;
}

std::optional<SocketAddress> readAddress(const toml::node& node, const std::string& path,
                                         AddressUse use, Diagnostics& diag) {
  const auto text = readString(node, path, diag);
  if (!text) return std::nullopt;
  std::string why;
  auto address = parseSocketAddress(*text, use == AddressUse::Valkey, &why);
  if (!address) {
    diag.add(node, path, "bad address " + inQuotes(*text) + ": " + why);
    return std::nullopt;
  }
  // Port 0 means "any free port": useful to listen on (tests do), meaningless to connect to.
  if (!address->isUnix() && address->port == 0 && use != AddressUse::Listen) {
    diag.add(node, path, "bad address " + inQuotes(*text) + ": port 0 cannot be connected to");
    return std::nullopt;
  }
  return address;
}

std::optional<std::vector<StringItem>> readStrings(const toml::node& node, const std::string& path,
                                                   Diagnostics& diag) {
  const auto* array = node.as_array();
  if (!array) {
    diag.add(node, path, "expected an array of strings, got " + describe(node));
    return std::nullopt;
  }
  std::vector<StringItem> items;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    std::string element_path = path + "[" + std::to_string(i) + "]";
    if (auto value = readString(element, element_path, diag)) {
      items.push_back(StringItem{std::move(*value), &element, std::move(element_path)});
    }
  }
  return items;
}

void reportUnknownValue(const toml::node& node, const std::string& path, const std::string& value,
                        const std::vector<std::string>& choices, Diagnostics& diag) {
  std::string expected;
  for (size_t i = 0; i < choices.size(); ++i) {
    expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  diag.add(node, path,
           "unknown value " + inQuotes(value) + " (expected " + expected + ")" +
               didYouMean(value, choices));
}

void TableReader::finish() {
  for (const auto& [key, value] : table_) {
    if (std::find(known_.begin(), known_.end(), key.str()) != known_.end()) continue;
    const Position at = key.source().begin.line ? positionOf(key.source()) : position();
    diag_.add(at, keyPath(key.str()),
              "unknown key " + inQuotes(key.str()) + didYouMean(key.str(), known_));
  }
}

}  // namespace sluice::config::loader_internal
