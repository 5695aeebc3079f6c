#include "proxy/worker_context.h"

#include <cstdio>
#include <random>

#include "proxy/downstream_connection.h"

namespace sluice::proxy {

WorkerContext::WorkerContext(uv_loop_t* loop, stats::WorkerStats* stats)
    : loop_(loop), stats_(stats) {
  std::random_device random;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%08x%08x", random(), random());
  request_id_prefix_ = buf;
}

std::string WorkerContext::nextRequestId() {
  return request_id_prefix_ + "-" + std::to_string(++request_counter_);
}

void WorkerContext::add(DownstreamConnection* connection) {
  connection->list_prev_ = nullptr;
  connection->list_next_ = head_;
  if (head_) head_->list_prev_ = connection;
  head_ = connection;
  ++count_;
}

void WorkerContext::remove(DownstreamConnection* connection) {
  if (connection->list_prev_) {
    connection->list_prev_->list_next_ = connection->list_next_;
  } else if (head_ == connection) {
    head_ = connection->list_next_;
  } else {
    return;  // not in the list
  }
  if (connection->list_next_) connection->list_next_->list_prev_ = connection->list_prev_;
  connection->list_prev_ = connection->list_next_ = nullptr;
  --count_;
}

std::vector<DownstreamConnection*> WorkerContext::connections() const {
  std::vector<DownstreamConnection*> out;
  out.reserve(count_);
  for (DownstreamConnection* c = head_; c; c = c->list_next_) out.push_back(c);
  return out;
}

}  // namespace sluice::proxy
