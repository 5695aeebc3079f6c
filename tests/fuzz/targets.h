#pragma once

// The fuzz targets' bodies, shared by the libFuzzer driver (tests/fuzz/fuzz_main.cc, built with
// clang when SLUICE_FUZZ=ON) and by a doctest that replays the corpus and every regression
// input under the normal test build, so a crash found once stays a test forever.

#include <array>
#include <cstddef>
#include <cstdint>

namespace sluice::fuzz {

// The request path: head parsing and body framing (fed in pieces whose sizes come from the
// input), target normalization and routing, header rewriting, identity extraction (trusted
// proxies, key parts, form and JSON body fields), key encoding.
void requestPath(const uint8_t* data, size_t size);

// The admin listener's request reading: its parser bounds, its head reading, the /limits
// query (strict %-decoding) and the limit and key it resolves, the JSON of its errors.
void adminRequest(const uint8_t* data, size_t size);

// The configuration loader on arbitrary text.
void configLoader(const uint8_t* data, size_t size);

// The response parser of the upstream side, and the headers built from it for the client.
void responsePath(const uint8_t* data, size_t size);

// The chunked request body: the input's bytes follow a chunked request head, under a body cap
// the input chooses. No more than the cap is ever handed on (a chunk size near 2^64 must not
// wrap the count), the pieces the bytes arrive in change nothing, and a body that completes
// reads back the same once re-chunked as Sluice sends it upstream.
void chunkedBody(const uint8_t* data, size_t size);

// The HTTP/2 frame path: the input's bytes follow the client preface into an H2Session
// (in pieces whose size the first byte chooses), on a loop and a transport of its own, with
// no socket: frames, HPACK, streams and their exchanges (answered by Sluice: no route),
// the flood budgets, drain.
void http2Frames(const uint8_t* data, size_t size);

// The rate limit service's messages (src/rls/messages.h): a RateLimitRequest read under
// bounds the first bytes choose; one that is read keeps every bound and reads back the same
// once written again. The same bytes as a RateLimitResponse (read, then written and read back
// the same) and as a HealthCheckRequest. An input that starts with 'Y' is the text of an
// envoyproxy/ratelimit YAML file instead (src/config/ratelimit_yaml.h): loaded or refused, with
// FILE:LINE:COL, never a crash.
void rlsMessages(const uint8_t* data, size_t size);

// The HTTP/2 upstream connection (src/upstream/h2_upstream_connection.h) on what an upstream
// sends: the input's bytes (after two that choose the piece size, how many streams, whether
// their DATA is taken, a stream cancelled at its head, a request body with trailers, a cap on
// concurrent streams) are the server's side of one connection, on a loop and a transport of
// its own, with no socket. Every stream hears its head once before its DATA and trailers, then
// exactly one last call; the connection closes once its peer left, after every stream ended,
// and leaves no handle open on the loop.
void h2UpstreamFrames(const uint8_t* data, size_t size);

using Target = void (*)(const uint8_t* data, size_t size);
struct NamedTarget {
  const char* name;  // its corpus (tests/fuzz/corpus/<name>) and its binary (fuzz_<name>)
  Target body;
};
extern const std::array<NamedTarget, 8> kTargets;

}  // namespace sluice::fuzz
