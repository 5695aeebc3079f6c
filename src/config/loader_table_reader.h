#pragma once

// Internal to the configuration loader (loader.cc): typed reads of TOML values that report
// every problem with its position and dotted key instead of stopping at the first. Only
// loader*.cc include this, which keeps toml++, slow to compile, out of every other file.

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// toml++ 3.3 asserts (aborts a debug build) on some malformed table headers, such as the
// typo "[[[limit]]]" or "[=", where the check right after the assertion would report them as
// ordinary parse errors (marzer/tomlplusplus#301). Builds without NDEBUG therefore get the
// NDEBUG behaviour: a configuration typo must never crash `sluice --check-config`.
#ifndef NDEBUG
#define TOML_ASSERT(expr) static_assert(true)
#endif
#include <toml++/toml.h>

#include "config/config.h"
#include "config/loader.h"
#include "protocol/decide_protocol.h"

namespace sluice::config::loader_internal {

// Counts, costs and bursts stay well below 2^53 so that the Lua scripts, whose numbers are
// doubles, compute them exactly.
constexpr int64_t kMaxCount = 1'000'000'000'000'000;
// A sliding_log keeps about 10 bytes per request in its window, a list
// (protocol/decide_protocol.h).
constexpr int64_t kMaxLogLimit = protocol::kMaxLogLimit;
static_assert(kMaxCount == protocol::kMaxCount);
constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

struct Position {
  int line = 0;  // 0 when unknown
  int column = 0;
};

inline Position positionOf(const toml::source_region& region) {
  return {static_cast<int>(region.begin.line), static_cast<int>(region.begin.column)};
}

// Collects every error of one load; they are sorted once the whole file has been read.
class Diagnostics {
 public:
  explicit Diagnostics(std::string file) : file_(std::move(file)) {}

  void add(Position at, std::string key, std::string message) {
    errors_.push_back(ConfigError{file_, at.line, at.column, std::move(key), std::move(message)});
  }
  void add(const toml::node& at, std::string key, std::string message) {
    add(positionOf(at.source()), std::move(key), std::move(message));
  }
  // By line, then column; errors at the same place keep the order they were found in.
  std::vector<ConfigError> sorted() &&;

 private:
  std::string file_;
  std::vector<ConfigError> errors_;
};

// Text checks shared by the sections.
std::string inQuotes(std::string_view text);  // 'text'
std::string lowerCase(std::string_view text);
std::string upperCase(std::string_view text);
bool isToken(std::string_view text);     // RFC 9110 token: header and cookie names, methods
bool isName(std::string_view text);      // [A-Za-z0-9_.-]+
bool isHostName(std::string_view text);  // letters, digits, '-', '.', '_'
bool hasSpaceOrControl(std::string_view text);
// ", did you mean 'x'?" for the closest candidate within two edits, else "".
std::string didYouMean(std::string_view word, const std::vector<std::string>& candidates);
std::string describe(const toml::node& node);  // "an integer", "a table", ...

// Typed reads of one value. Each reports what is wrong at the value's position under `path`
// and returns nullopt, so that the caller keeps its default and reading goes on.

enum class AddressUse { Listen, Upstream, Valkey };

std::optional<std::string> readString(const toml::node& node, const std::string& path,
                                      Diagnostics& diag);
std::optional<int64_t> readInteger(const toml::node& node, const std::string& path, int64_t min,
                                   int64_t max, Diagnostics& diag);
std::optional<bool> readBool(const toml::node& node, const std::string& path, Diagnostics& diag);
std::optional<Duration> readDuration(const toml::node& node, const std::string& path,
                                     bool allow_zero, Diagnostics& diag);
std::optional<SocketAddress> readAddress(const toml::node& node, const std::string& path,
                                         AddressUse use, Diagnostics& diag);

struct StringItem {
  std::string value;
  const toml::node* node;  // owned by the parsed document
  std::string path;        // e.g. "route[0].limits[1]"
};

// An array of strings; elements of another type are reported and left out.
std::optional<std::vector<StringItem>> readStrings(const toml::node& node, const std::string& path,
                                                   Diagnostics& diag);

template <class E>
using EnumNames = std::initializer_list<std::pair<std::string_view, E>>;

// Reports "unknown value 'x' (expected a, b or c), did you mean 'a'?".
void reportUnknownValue(const toml::node& node, const std::string& path, const std::string& value,
                        const std::vector<std::string>& choices, Diagnostics& diag);

template <class E>
std::optional<E> readEnum(const toml::node& node, const std::string& path, EnumNames<E> names,
                          Diagnostics& diag) {
  const auto text = readString(node, path, diag);
  if (!text) return std::nullopt;
  std::vector<std::string> choices;
  for (const auto& [name, value] : names) {
    if (name == *text) return value;
    choices.emplace_back(name);
  }
  reportUnknownValue(node, path, *text, choices, diag);
  return std::nullopt;
}

// Reads one TOML table. Every getter names a key the table may hold, present or not, so that
// finish() can tell an unknown key (a typo) from an absent one and suggest the closest known
// key. Getters return nullopt both for an absent key and for a bad value (already reported).
// The table must outlive the reader.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string path, Diagnostics& diag)
      : table_(table), path_(std::move(path)), diag_(diag) {}

  const std::string& path() const { return path_; }
  std::string keyPath(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  // The table header (or the '{' of an inline table).
  Position position() const { return positionOf(table_.source()); }

  // The node under `key`, or null when absent.
  const toml::node* node(std::string_view key) {
    known_.emplace_back(key);
    return table_.get(key);
  }
  bool has(std::string_view key) { return node(key) != nullptr; }

  // A required key that is absent is reported at the table's header, where it should go.
  void missing(std::string_view key) {
    diag_.add(position(), keyPath(key), "required key is missing");
  }
  // An error about the value under `key`, which must be present.
  void error(std::string_view key, std::string message) {
    diag_.add(*table_.get(key), keyPath(key), std::move(message));
  }

  std::optional<std::string> string(std::string_view key) {
    const auto* n = node(key);
    return n ? readString(*n, keyPath(key), diag_) : std::nullopt;
  }
  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max) {
    const auto* n = node(key);
    return n ? readInteger(*n, keyPath(key), min, max, diag_) : std::nullopt;
  }
  std::optional<bool> boolean(std::string_view key) {
    const auto* n = node(key);
    return n ? readBool(*n, keyPath(key), diag_) : std::nullopt;
  }
  std::optional<Duration> duration(std::string_view key, bool allow_zero) {
    const auto* n = node(key);
    return n ? readDuration(*n, keyPath(key), allow_zero, diag_) : std::nullopt;
  }
  std::optional<SocketAddress> address(std::string_view key, AddressUse use) {
    const auto* n = node(key);
    return n ? readAddress(*n, keyPath(key), use, diag_) : std::nullopt;
  }
  std::optional<std::vector<StringItem>> strings(std::string_view key) {
    const auto* n = node(key);
    return n ? readStrings(*n, keyPath(key), diag_) : std::nullopt;
  }
  template <class E>
  std::optional<E> enumeration(std::string_view key, EnumNames<E> names) {
    const auto* n = node(key);
    return n ? readEnum(*n, keyPath(key), names, diag_) : std::nullopt;
  }

  // Reports every key that no getter asked for, at the key itself.
  void finish();

 private:
  const toml::table& table_;
  std::string path_;
  Diagnostics& diag_;
  std::vector<std::string> known_;
};

}  // namespace sluice::config::loader_internal
