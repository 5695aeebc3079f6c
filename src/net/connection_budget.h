#pragma once

// The client connections the whole process holds, across every worker's listener: a cap on
// all of them (max_connections), an optional cap per client address
// (max_connections_per_client), and a reserve of file descriptors that client connections
// may not take, so that Valkey reconnections, upstream connections and the admin listener
// keep working when the data listener is full. A connection beyond a cap is closed at once
// after accept (and counted by the caller), before any byte is read.
//
// Thread-safe: the count is atomic; the per-address table (used only when that cap is set)
// has a mutex, taken twice per connection.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace sluice::net {

class ConnectionBudget {
 public:
  enum class Refusal { None, MaxConnections, PerClient, Descriptors };

  // What an admitted connection holds; giving it back (destroying it) frees its place.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { release(); }
    void release();

   private:
    friend class ConnectionBudget;
    ConnectionBudget* budget_ = nullptr;
    std::string client_;  // counted per client when not empty
  };

  struct Limits {
    uint64_t max_connections = 0;             // 0: no cap
    uint64_t max_connections_per_client = 0;  // 0: no cap
  };

  // `descriptor_limit`: the open-files limit (RLIMIT_NOFILE soft); `reserve` of them stay
  // for everything that is not a client connection.
  ConnectionBudget(uint64_t descriptor_limit, uint64_t reserve);

  // The process's budget, made on first use from its RLIMIT_NOFILE.
  static ConnectionBudget& process();
  // The reserve left for the rest when the open-files limit is `limit`.
  static uint64_t reserveFor(uint64_t limit);

  // `fd`: the accepted socket's descriptor (descriptors are allocated lowest first, so its
  // number tells how many are open); `client`: the peer's address text (may be empty).
  Refusal admit(int fd, const std::string& client, const Limits& limits, Ticket* ticket);

  uint64_t open() const { return open_.load(std::memory_order_relaxed); }

 private:
  void giveBack(const std::string& client);

  const uint64_t descriptor_limit_;
  const uint64_t reserve_;
  std::atomic<uint64_t> open_{0};
  std::mutex mutex_;
  std::unordered_map<std::string, uint64_t> per_client_;
};

}  // namespace sluice::net
