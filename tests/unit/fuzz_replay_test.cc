// Replays the fuzz corpus and every input that once crashed (tests/fuzz/regressions/) through
// the fuzz targets' bodies, in the normal (and the sanitizer) test build.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "targets.h"

namespace {

using Target = void (*)(const uint8_t*, size_t);

size_t replay(const std::string& name, Target target) {
  size_t count = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const std::filesystem::path dir =
        std::filesystem::path(SLUICE_SOURCE_DIR) / "tests" / "fuzz" / kind / name;
    if (!std::filesystem::exists(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      INFO("input: " << entry.path().string());
      target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++count;
    }
  }
  return count;
}

}  // namespace

TEST_CASE("fuzz corpus and regressions replay without a crash") {
  CHECK(replay("request", sluice::fuzz::requestPath) >= 10);
  CHECK(replay("config", sluice::fuzz::configLoader) >= 5);
  CHECK(replay("response", sluice::fuzz::responsePath) >= 5);
  CHECK(replay("chunked", sluice::fuzz::chunkedBody) >= 5);
  CHECK(replay("admin", sluice::fuzz::adminRequest) >= 5);
  CHECK(replay("http2", sluice::fuzz::http2Frames) >= 5);
  CHECK(replay("rls", sluice::fuzz::rlsMessages) >= 5);
  CHECK(replay("h2upstream", sluice::fuzz::h2UpstreamFrames) >= 10);
}
