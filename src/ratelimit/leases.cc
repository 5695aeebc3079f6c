#include "ratelimit/leases.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "core/logging.h"
#include "stats/stats.h"

namespace sluice::ratelimit {

LeaseKeeper::LeaseKeeper(uv_loop_t* loop, stats::WorkerStats& stats, Resender& resender)
    : loop_(loop), stats_(stats), resender_(resender) {
  std::random_device random;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%08x%08x-", random(), random());
  prefix_ = buf;
}

LeaseKeeper::~LeaseKeeper() {
  // What is held now is freed by its lease (the worker stops; a drain ended its requests).
  stats_.concurrency_slots.add(-static_cast<int64_t>(held_.size()));
}

std::string LeaseKeeper::newName() { return prefix_ + std::to_string(++counter_); }

LeaseKeeper::Id LeaseKeeper::hold(const std::shared_ptr<valkey::Store>& store,
                                  const std::string& key, const std::string& name,
                                  int64_t lease_ms) {
  const Id id = ++next_id_;
  const uint64_t now = loopNow(loop_);
  held_.emplace(id, Slot{store, key, name, lease_ms, now});
  stats_.concurrency_slots.add(1);
  const uint64_t due = now + static_cast<uint64_t>(lease_ms / 3);
  if (!timer_ || !timer_->active() || due < next_due_ms_) startTimer(due, now);
  return id;
}

void LeaseKeeper::release(Id id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  releases_.push_back(std::move(it->second));
  held_.erase(it);
  stats_.concurrency_slots.add(-1);
  if (held_.empty() && timer_) timer_->stop();
}

void LeaseKeeper::release(const std::shared_ptr<valkey::Store>& store, const std::string& key,
                          const std::string& name, int64_t lease_ms) {
  releases_.push_back(Slot{store, key, name, lease_ms, 0});
}

void LeaseKeeper::flush() {
  if (releases_.empty()) return;
  std::vector<Slot> releases;
  releases.swap(releases_);
  std::vector<const Slot*> slots;
  slots.reserve(releases.size());
  for (const Slot& s : releases) slots.push_back(&s);
  send(LeaseOp::Release, slots);
}

void LeaseKeeper::send(LeaseOp op, const std::vector<const Slot*>& slots) {
  // Grouped by store and cluster slot, in order of first appearance.
  struct Group {
    const std::shared_ptr<valkey::Store>* store;
    unsigned cluster_slot;
    std::vector<LeaseItem> items;
  };
  std::vector<Group> groups;
  for (const Slot* s : slots) {
    const unsigned cluster_slot = s->store->slotOf(s->key);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.store->get() == s->store.get() && g.cluster_slot == cluster_slot;
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{&s->store, cluster_slot, {}});
    it->items.push_back({&s->key, &s->name, s->lease_ms});
  }
  for (const Group& g : groups) {
    std::string command = leaseCommand((*g.store)->decideFunction(), op, g.items);
    resender_.send(*g.store,
                   op == LeaseOp::Release ? Resender::Kind::Release : Resender::Kind::Renew,
                   std::move(command), *g.items.front().key);
  }
}

void LeaseKeeper::onTimer(void* self) { static_cast<LeaseKeeper*>(self)->renew(); }

// Renews every slot a third of whose lease has passed since its take or last renewal.
void LeaseKeeper::renew() {
  const uint64_t now = loopNow(loop_);
  std::vector<const Slot*> due;
  for (auto& [id, slot] : held_) {
    if (now - slot.renewed_ms >= static_cast<uint64_t>(slot.lease_ms / 3)) {
      slot.renewed_ms = now;
      due.push_back(&slot);
    }
  }
  if (!due.empty()) send(LeaseOp::Renew, due);
  schedule();
}

void LeaseKeeper::schedule() {
  if (held_.empty()) {
    if (timer_) timer_->stop();
    return;
  }
  const uint64_t now = loopNow(loop_);
  uint64_t next = UINT64_MAX;
  for (const auto& [id, slot] : held_) {
    const uint64_t due = slot.renewed_ms + static_cast<uint64_t>(slot.lease_ms / 3);
    next = std::min(next, due > now ? due - now : 0);
  }
  startTimer(now + next, now);
}

void LeaseKeeper::startTimer(uint64_t due_ms, uint64_t now_ms) {
  if (!timer_) timer_ = std::make_unique<Timer>(loop_, onTimer, this);
  next_due_ms_ = due_ms;
  timer_->start(due_ms - now_ms);
}

}  // namespace sluice::ratelimit
