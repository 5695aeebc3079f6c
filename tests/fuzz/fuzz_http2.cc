// libFuzzer driver; the body is sluice::fuzz::http2Frames (tests/fuzz/targets.cc).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::http2Frames(data, size);
  return 0;
}
