// libFuzzer driver; the body is sluice::fuzz::adminRequest (tests/fuzz/targets.cc).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::adminRequest(data, size);
  return 0;
}
