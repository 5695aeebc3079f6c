#include "proxy/worker_context.h"

#include "proxy/downstream_connection.h"

namespace sluice::proxy {

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
