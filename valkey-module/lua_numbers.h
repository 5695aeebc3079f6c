#pragma once

// Lua 5.1's number rules as Valkey's Lua applies them, so that the module reads, computes and
// writes every number exactly as lua/*.lua does: numbers are doubles; a string becomes a number
// by luaO_str2d (strtod, hex by strtoul, trailing spaces; the string ends at its first NUL);
// string.format('%d', x), a Lua number given back as a reply integer and struct.pack('I') cast
// the double to a 64-bit integer (on x86-64 an out-of-range or NaN double becomes INT64_MIN,
// which is what the cast here returns too, without the undefined behaviour); `..` writes a
// number with %.14g; math.min and math.max keep the first argument unless the other compares
// smaller (greater), so NaN behaves as in Lua; `a % b` is a - floor(a / b) * b.

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace sluice::lua {

// luaO_str2d of the C string that `text` starts with (up to its first NUL); false when Lua
// reads no number.
inline bool toNumber(std::string_view text, double* out) {
  // What a call mostly holds, a decimal whole number of at most 18 digits: exact in 64 bits,
  // and its conversion rounds to the nearest double as strtod's does (the same value).
  if (!text.empty() && text.size() <= 18) {
    uint64_t v = 0;
    size_t i = 0;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i)
      v = v * 10 + static_cast<uint64_t>(text[i] - '0');
    if (i == text.size()) {
      *out = static_cast<double>(v);
      return true;
    }
  }
  text = text.substr(0, std::min(text.size(), text.find('\0')));
  // (a short text is copied to the stack, a longer one to the heap, to end it with a NUL)
  char small[64];
  std::string copy;
  const char* s = small;
  if (text.size() < sizeof small) {
    std::memcpy(small, text.data(), text.size());
    small[text.size()] = '\0';
  } else {
    copy.assign(text);
    s = copy.c_str();
  }
  char* end = nullptr;
  double r = std::strtod(s, &end);
  if (end == s) return false;
  if (*end == 'x' || *end == 'X') r = static_cast<double>(std::strtoul(s, &end, 16));
  while (*end != '\0' && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (*end != '\0') return false;
  *out = r;
  return true;
}

// (long long)d as x86-64's cvttsd2si computes it.
inline long long toInteger(double d) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return INT64_MIN;
  return static_cast<long long>(d);
}

// luaL_checkint: the double to ptrdiff_t, then to int (its low 32 bits).
inline int toInt(double d) {
  return static_cast<int>(static_cast<uint32_t>(static_cast<uint64_t>(toInteger(d))));
}

inline std::string formatD(double d) { return std::to_string(toInteger(d)); }

// formatD into buf (at least kFormatDBytes): its length.
constexpr size_t kFormatDBytes = 24;
inline size_t formatD(char* buf, double d) {
  return static_cast<size_t>(std::to_chars(buf, buf + kFormatDBytes, toInteger(d)).ptr - buf);
}

inline std::string format14g(double d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.14g", d);
  return buf;
}

inline double min(double a, double b) { return b < a ? b : a; }
inline double max(double a, double b) { return b > a ? b : a; }
inline double mod(double a, double b) { return a - std::floor(a / b) * b; }

}  // namespace sluice::lua
