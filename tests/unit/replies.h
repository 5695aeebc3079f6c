#pragma once

// Valkey replies for unit tests, built by hand.

#include <cstdint>
#include <vector>

#include "valkey/reply.h"

namespace sluice::testing {

inline valkey::Reply integer(int64_t value) {
  valkey::Reply r;
  r.type = valkey::Reply::Type::Integer;
  r.integer = value;
  return r;
}

// An array of integers.
inline valkey::Reply integers(const std::vector<int64_t>& values) {
  valkey::Reply r;
  r.type = valkey::Reply::Type::Array;
  for (int64_t v : values) r.elements.push_back(integer(v));
  return r;
}

}  // namespace sluice::testing
