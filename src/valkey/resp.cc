#include "valkey/resp.h"

#include <charconv>
#include <cstring>

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

// "$<len>\r\n<arg>\r\n"
size_t bulkSize(std::string_view arg) { return 1 + digits(arg.size()) + 2 + arg.size() + 2; }

// Writes into a buffer sized beforehand to the exact length.
class Writer {
 public:
  explicit Writer(std::string& out) : p_(out.data()) {}
  void header(char type, size_t n) {
    *p_++ = type;
    p_ = std::to_chars(p_, p_ + 20, n).ptr;
    crlf();
  }
  void bulk(std::string_view arg) {
    header('$', arg.size());
    std::memcpy(p_, arg.data(), arg.size());
    p_ += arg.size();
    crlf();
  }

 private:
  void crlf() {
    *p_++ = '\r';
    *p_++ = '\n';
  }
  char* p_;
};

}  // namespace

std::string formatCommand(const std::vector<std::string>& argv) {
  size_t size = 1 + digits(argv.size()) + 2;
  for (const auto& a : argv) size += bulkSize(a);
  std::string out(size, '\0');
  Writer w(out);
  w.header('*', argv.size());
  for (const auto& a : argv) w.bulk(a);
  return out;
}

std::string formatEvalsha(std::string_view sha, const std::vector<std::string>& keys,
                          const std::vector<std::string>& args) {
  char count[24];
  const std::string_view numkeys(count,
                                 std::to_chars(count, count + sizeof count, keys.size()).ptr - count);
  const size_t n = 3 + keys.size() + args.size();
  size_t size = 1 + digits(n) + 2 + bulkSize("EVALSHA") + bulkSize(sha) + bulkSize(numkeys);
  for (const auto& k : keys) size += bulkSize(k);
  for (const auto& a : args) size += bulkSize(a);
  std::string out(size, '\0');
  Writer w(out);
  w.header('*', n);
  w.bulk("EVALSHA");
  w.bulk(sha);
  w.bulk(numkeys);
  for (const auto& k : keys) w.bulk(k);
  for (const auto& a : args) w.bulk(a);
  return out;
}

}  // namespace sluice::valkey
