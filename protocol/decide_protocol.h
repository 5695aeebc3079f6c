#pragma once

// The decide protocol's constants: the layout lua/decide.lua describes at its top (and
// src/ratelimit/script_codec.h repeats from the gateway's side), as numbers. The Valkey module
// (valkey-module/) follows it; the gateway's codec is to adopt it. Plain C++17 constexpr, no
// other include: the module is built apart from the gateway.

#include <cstddef>
#include <cstdint>

namespace sluice::protocol {

// What SLUICE.VERSION answers: a gateway uses the module only when it speaks this version.
// 2: a sliding_log's key is a list (it was one string of packed doubles).
inline constexpr long long kProtocolVersion = 2;

// Fields of one limit definition: algorithm, limit, window_ms, burst, count_denied, shadow,
// keep.
inline constexpr size_t kDefinitionFields = 7;
// Undo: per key algorithm, limit, window_ms, cost, T (or a concurrency slot's name).
inline constexpr size_t kUndoFieldsPerKey = 5;
// Lease: per key the slot's name and the lease (ms), after the operation.
inline constexpr size_t kLeaseFieldsPerKey = 2;

// A request's text: "<definition>:<cost>[~|!][@<i>]" joined by ",".
inline constexpr char kLaterMarker = '~';   // checked, not charged (cost_from)
inline constexpr char kForcedMarker = '!';  // charged whether it fits or not
inline constexpr char kKeyIndexMarker = '@';
inline constexpr char kDebtMarker = 'u';  // an undo's token_bucket cost "u<N>": N us of debt
inline constexpr char kLimitSeparator = ',';
inline constexpr char kCostSeparator = ':';

// Whole numbers: limit, window_ms, burst and keep 1 .. kMaxCount, a cost 0 .. kMaxCost.
inline constexpr long long kMaxCount = 1000000000000000LL;  // 10^15
inline constexpr long long kMaxCost = kMaxCount;
inline constexpr long long kMinLimit = 1;
inline constexpr long long kMinCost = 0;
// Waits in a reply are at most 2^31 - 1 s; a token bucket's debt (us) saturates there too.
inline constexpr long long kMaxWaitMs = 2147483647LL * 1000;
inline constexpr long long kMaxDebtUs = kMaxWaitMs * 1000;
// Counts of fixed_window and sliding_window saturate at 2^52 (exact in doubles).
inline constexpr long long kMaxStoredCount = 1LL << 52;
// A sliding_log's key is a list of its entries' times, at most kMaxLogEntries (a charge that
// would make it longer fails its request); the configuration keeps a sliding_log's limit at
// most kMaxLogLimit, whose log (at most 2 * limit + 1 entries) stays far below that.
inline constexpr size_t kMaxLogEntries = size_t{8} << 20;
inline constexpr long long kMaxLogLimit = 1000000;
// Window numbers are stored modulo 2^32.
inline constexpr long long kWindowNumbers = 1LL << 32;

// The reply: the call's time, then per limit remaining, reset_ms, retry_ms, and a 4th value
// (the debt, us, its charge added) for a token_bucket that is a shadow and counts denied.
inline constexpr size_t kLimitReplyValues = 3;
inline constexpr size_t kShadowBucketReplyValues = 4;

}  // namespace sluice::protocol
