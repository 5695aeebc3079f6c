// libFuzzer driver; the body is sluice::fuzz::chunkedBody (tests/fuzz/targets.cc).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::chunkedBody(data, size);
  return 0;
}
