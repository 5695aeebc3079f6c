#pragma once

// An ordered list of header fields, as received. Names keep their case; lookups ignore it.
// Requests carry a few dozen fields at most, so a vector beats any map here.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::http {

bool iequals(std::string_view a, std::string_view b);
std::string toLower(std::string_view text);
std::string_view trim(std::string_view text);  // spaces and tabs at both ends
int hexDigit(char c);                          // 0..15, or -1
// A Content-Length value as an HTTP/2 field carries it (nghttp2 has checked it): 1 to 19
// digits, nothing else; nullopt otherwise.
std::optional<uint64_t> parseContentLength(std::string_view value);
// RFC 9110 7.2 / RFC 3986 3.2.2: a Host (or the authority of an absolute-form target) is a
// reg-name or an IP literal, and a port. A value with other bytes (spaces, quotes, slashes)
// would go upstream and into logs as it is. Empty is allowed (an empty authority).
bool validAuthority(std::string_view host);

// Calls fn(element) for each comma-separated element of a list-valued field, trimmed, skipping
// empty ones (RFC 9110 section 5.6.1).
template <typename Fn>
void forEachListElement(std::string_view value, Fn&& fn) {
  while (!value.empty()) {
    const auto comma = value.find(',');
    std::string_view element = trim(value.substr(0, comma));
    if (!element.empty()) fn(element);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
}

struct Header {
  std::string name;
  std::string value;
};

// Serialized "Name: value\r\n" lines: `f(name, value)` for each, the name as written, the
// value without the whitespace before it.
template <typename F>
void forEachFieldLine(std::string_view lines, F&& f) {
  while (!lines.empty()) {
    const size_t end = lines.find("\r\n");
    const std::string_view line = lines.substr(0, end);
    lines = end == std::string_view::npos ? std::string_view() : lines.substr(end + 2);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    f(line.substr(0, colon), value);
  }
}

// The same lines appended as fields with lower-case names (what an HTTP/2 head carries).
void appendFieldLines(std::vector<Header>& out, std::string_view lines);

class HeaderMap {
 public:
  using const_iterator = std::vector<Header>::const_iterator;

  void add(std::string name, std::string value) {
    headers_.push_back({std::move(name), std::move(value)});
  }
  // The first field with this name, or nullptr.
  const std::string* get(std::string_view name) const;
  size_t count(std::string_view name) const;
  // Every field with this name joined with ", " (the way a list-valued field is combined).
  std::optional<std::string> getJoined(std::string_view name) const;
  // Removes every field with this name; returns how many.
  size_t remove(std::string_view name);
  void set(std::string name, std::string value);  // remove + add
  // The first field with this name gets `value` (its name keeps its case) and the others are
  // removed; without one, the field is inserted first.
  void replace(std::string_view name, std::string value);

  std::vector<Header>& fields() { return headers_; }
  const std::vector<Header>& fields() const { return headers_; }
  const_iterator begin() const { return headers_.begin(); }
  const_iterator end() const { return headers_.end(); }
  size_t size() const { return headers_.size(); }
  bool empty() const { return headers_.empty(); }
  void clear() { headers_.clear(); }

 private:
  std::vector<Header> headers_;
};

}  // namespace sluice::http
