#include "net/connection_budget.h"

#include <sys/resource.h>

#include <algorithm>

namespace sluice::net {

ConnectionBudget::Ticket& ConnectionBudget::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    release();
    budget_ = other.budget_;
    client_ = std::move(other.client_);
    other.budget_ = nullptr;
    other.client_.clear();
  }
  return *this;
}

void ConnectionBudget::Ticket::release() {
  if (!budget_) return;
  budget_->giveBack(client_);
  budget_ = nullptr;
  client_.clear();
}

ConnectionBudget::ConnectionBudget(uint64_t descriptor_limit, uint64_t reserve)
    : descriptor_limit_(descriptor_limit), reserve_(reserve) {}

uint64_t ConnectionBudget::reserveFor(uint64_t limit) {
  // 1/16 of the descriptors, at least 64 and at most 1024: a Valkey connection per worker, the
  // admin listener's clients, and upstream connections opened while the listener is full.
  return std::clamp<uint64_t>(limit / 16, 64, 1024);
}

ConnectionBudget& ConnectionBudget::process() {
  static ConnectionBudget budget = [] {
    rlimit rl{};
    uint64_t limit = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) limit = rl.rlim_cur;
    if (rl.rlim_cur == RLIM_INFINITY) limit = uint64_t{1} << 20;
    return ConnectionBudget(limit, reserveFor(limit));
  }();
  return budget;
}

ConnectionBudget::Refusal ConnectionBudget::admit(int fd, const std::string& client,
                                                  const Limits& limits, Ticket* ticket) {
  if (fd >= 0 && static_cast<uint64_t>(fd) + reserve_ >= descriptor_limit_) {
    return Refusal::Descriptors;
  }
  const uint64_t now = open_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (limits.max_connections != 0 && now > limits.max_connections) {
    open_.fetch_sub(1, std::memory_order_relaxed);
    return Refusal::MaxConnections;
  }
  ticket->release();
  ticket->budget_ = this;
  if (limits.max_connections_per_client != 0 && !client.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t& count = per_client_[client];
    if (count >= limits.max_connections_per_client) {
      if (count == 0) per_client_.erase(client);
      ticket->budget_ = nullptr;
      open_.fetch_sub(1, std::memory_order_relaxed);
      return Refusal::PerClient;
    }
    ++count;
    ticket->client_ = client;
  }
  return Refusal::None;
}

void ConnectionBudget::giveBack(const std::string& client) {
  open_.fetch_sub(1, std::memory_order_relaxed);
  if (client.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = per_client_.find(client);
  if (it != per_client_.end() && --it->second == 0) per_client_.erase(it);
}

}  // namespace sluice::net
