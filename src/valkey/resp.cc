#include "valkey/resp.h"

#include <charconv>

namespace sluice::valkey {

namespace {

size_t digits(size_t n) {
  size_t d = 1;
  while (n >= 10) {
    n /= 10;
    ++d;
  }
  return d;
}

void appendHeader(std::string& out, char type, size_t n) {
  char buf[24];
  buf[0] = type;
  char* end = std::to_chars(buf + 1, buf + sizeof buf - 2, n).ptr;
  *end++ = '\r';
  *end++ = '\n';
  out.append(buf, static_cast<size_t>(end - buf));
}

}  // namespace

size_t bulkSize(std::string_view arg) { return 1 + digits(arg.size()) + 2 + arg.size() + 2; }

void appendArrayHeader(std::string& out, size_t n) { appendHeader(out, '*', n); }

void appendBulk(std::string& out, std::string_view arg) {
  appendHeader(out, '$', arg.size());
  out.append(arg);
  out.append("\r\n", 2);
}

std::string formatCommand(const std::vector<std::string>& argv) {
  size_t size = 1 + digits(argv.size()) + 2;
  for (const auto& a : argv) size += bulkSize(a);
  std::string out;
  out.reserve(size);
  appendArrayHeader(out, argv.size());
  for (const auto& a : argv) appendBulk(out, a);
  return out;
}

}  // namespace sluice::valkey
