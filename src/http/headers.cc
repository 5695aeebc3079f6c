#include "http/headers.h"

#include <algorithm>

namespace sluice::http {

namespace {
inline char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }
}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string toLower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = lower(c);
  return out;
}

std::optional<uint64_t> parseContentLength(std::string_view value) {
  if (value.empty() || value.size() > 19) return std::nullopt;  // 19 digits fit in 63 bits
  uint64_t length = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    length = length * 10 + static_cast<uint64_t>(c - '0');
  }
  return length;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

bool validAuthority(std::string_view host) {
  for (unsigned char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string_view("-._~!$&'()*+,;=:[]%").find(static_cast<char>(c)) !=
                        std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

const std::string* HeaderMap::get(std::string_view name) const {
  for (const auto& h : headers_) {
    if (iequals(h.name, name)) return &h.value;
  }
  return nullptr;
}

size_t HeaderMap::count(std::string_view name) const {
  return static_cast<size_t>(std::count_if(headers_.begin(), headers_.end(),
                                           [&](const Header& h) { return iequals(h.name, name); }));
}

std::optional<std::string> HeaderMap::getJoined(std::string_view name) const {
  std::optional<std::string> out;
  for (const auto& h : headers_) {
    if (!iequals(h.name, name)) continue;
    if (out) {
      *out += ", ";
      *out += h.value;
    } else {
      out = h.value;
    }
  }
  return out;
}

size_t HeaderMap::remove(std::string_view name) {
  const auto before = headers_.size();
  std::erase_if(headers_, [&](const Header& h) { return iequals(h.name, name); });
  return before - headers_.size();
}

void HeaderMap::set(std::string name, std::string value) {
  remove(name);
  add(std::move(name), std::move(value));
}

void HeaderMap::replace(std::string_view name, std::string value) {
  auto first = std::find_if(headers_.begin(), headers_.end(),
                            [&](const Header& h) { return iequals(h.name, name); });
  if (first == headers_.end()) {
    headers_.insert(headers_.begin(), Header{std::string(name), std::move(value)});
    return;
  }
  first->value = std::move(value);
  headers_.erase(std::remove_if(std::next(first), headers_.end(),
                                [&](const Header& h) { return iequals(h.name, name); }),
                 headers_.end());
}

void appendFieldLines(std::vector<Header>& out, std::string_view lines) {
  forEachFieldLine(lines, [&](std::string_view name, std::string_view value) {
    out.push_back({toLower(name), std::string(value)});
  });
}

}  // namespace sluice::http
