// The libFuzzer driver of every target (tests/fuzz/targets.cc): one binary, sluice_fuzz, that
// runs the target whose name it is called by, fuzz_<name> (the build makes those links), so
// that the sanitizer build links one fuzzer instead of one per target.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "targets.h"

namespace {

sluice::fuzz::Target chosen = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  std::string_view self = *argc > 0 ? (*argv)[0] : "";
  if (const size_t slash = self.rfind('/'); slash != std::string_view::npos) {
    self.remove_prefix(slash + 1);
  }
  for (const auto& target : sluice::fuzz::kTargets) {
    if (self == "fuzz_" + std::string(target.name)) chosen = target.body;
  }
  if (chosen == nullptr) {
    std::fprintf(stderr, "%.*s: run as fuzz_<target> (a link to this binary), a target one of:",
                 static_cast<int>(self.size()), self.data());
    for (const auto& target : sluice::fuzz::kTargets) std::fprintf(stderr, " %s", target.name);
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chosen(data, size);
  return 0;
}
