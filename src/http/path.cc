#include "http/path.h"

#include <vector>

#include "http/headers.h"

namespace sluice::http {

namespace {

bool unreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

}  // namespace

bool decodeUnreserved(std::string_view in, std::string* out, std::string* error) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c != '%') {
      out->push_back(c);
      continue;
    }
    if (i + 2 >= in.size()) {
      *error = "truncated %-escape in path";
      return false;
    }
    const int hi = hexDigit(in[i + 1]);
    const int lo = hexDigit(in[i + 2]);
    if (hi < 0 || lo < 0) {
      *error = "malformed %-escape in path";
      return false;
    }
    const auto value = static_cast<unsigned char>(hi * 16 + lo);
    if (value == 0) {
      *error = "NUL in path";
      return false;
    }
    if (unreserved(value)) {
      out->push_back(static_cast<char>(value));
    } else {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out->push_back('%');
      out->push_back(kHex[value >> 4]);
      out->push_back(kHex[value & 15]);
    }
    i += 2;
  }
  return true;
}

bool normalizePath(std::string_view path, bool strip_params, std::string* out, std::string* error) {
  std::vector<std::string_view> segments;
  std::string_view rest = path.substr(1);
  bool trailing_slash = false;
  while (true) {
    const auto slash = rest.find('/');
    std::string_view segment = rest.substr(0, slash);
    const bool last = slash == std::string_view::npos;
    if (strip_params) segment = segment.substr(0, segment.find(';'));
    if (segment.empty()) {
      // Merged into the slash before it; the last one means the path ends with a slash.
      if (last) trailing_slash = true;
    } else if (segment == ".") {
      trailing_slash = last;
    } else if (segment == "..") {
      if (segments.empty()) {
        *error = "path climbs above the root";
        return false;
      }
      segments.pop_back();
      trailing_slash = last;
    } else {
      segments.push_back(segment);
      trailing_slash = false;
    }
    if (last) break;
    rest.remove_prefix(slash + 1);
  }
  out->clear();
  out->reserve(path.size());
  for (const auto& segment : segments) {
    out->push_back('/');
    out->append(segment);
  }
  if (trailing_slash || out->empty()) out->push_back('/');
  return true;
}

bool isNormalPath(std::string_view path) {
  if (path.empty() || path[0] != '/' || path.find('%') != std::string_view::npos) return false;
  size_t start = 1;
  while (true) {
    const size_t slash = path.find('/', start);
    const std::string_view segment = path.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (slash == std::string_view::npos) return segment != "." && segment != "..";
    if (segment.empty() || segment == "." || segment == "..") return false;
    start = slash + 1;
  }
}

std::string_view withoutTrailingSlash(std::string_view path) {
  if (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return path;
}

}  // namespace sluice::http
