// libFuzzer driver; the body is sluice::fuzz::rlsMessages (tests/fuzz/targets.cc).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::rlsMessages(data, size);
  return 0;
}
