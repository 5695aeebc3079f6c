#include "downstream/connection.h"

#include <algorithm>
#include <string_view>

#include "downstream/h2_session.h"
#include "stats/stats.h"

namespace sluice::downstream {

namespace {

std::optional<IpAddress> peerOf(const net::Transport& transport) {
  const sockaddr* peer = transport.peerAddress();
  if (!peer) return std::nullopt;
  std::optional<IpAddress> ip = IpAddress::fromSockaddr(peer);
  if (ip) ip = ip->unmapped();
  return ip;
}

}  // namespace

Connection::Connection(worker::WorkerContext& worker, std::unique_ptr<net::Transport> transport,
                       net::ConnectionBudget::Ticket ticket, proxy::Listener listener)
    : worker_(worker),
      ticket_(std::move(ticket)),
      transport_(std::move(transport)),
      peer_ip_(peerOf(*transport_)),
      peer_text_(peer_ip_ ? peer_ip_->toString() : std::string()),
      listener_(listener),
      sniffing_(worker.snapshot()->config->server.http2 ||
                listener == proxy::Listener::RateLimitService),
      http1_(worker, *transport_, peer_ip_, peer_text_, listener) {
  transport_->setCallbacks(this);
  worker_.add(this);
  worker_.stats().connections_open.add(1);
  worker_.stats().connections_total.inc();
}

Connection::~Connection() {
  worker_.remove(this);
  worker_.stats().connections_open.add(-1);
}

void Connection::start() {
  transport_->readStart();
  http1_.start();
}

void Connection::onRead(const char* data, size_t len) {
  if (h2_) {
    h2_->onRead(data, len);
  } else if (sniffing_ && http1_.reading()) {
    sniff(data, len);
  } else {
    http1_.onRead(data, len);
  }
}

void Connection::sniff(const char* data, size_t len) {
  sniffed_.append(data, len);
  const std::string_view preface = kClientPreface;
  const size_t n = std::min(sniffed_.size(), preface.size());
  std::string received;
  if (sniffed_.compare(0, n, preface.substr(0, n)) != 0) {
    sniffing_ = false;  // HTTP/1.1
    received.swap(sniffed_);
    http1_.onRead(received.data(), received.size());
    return;
  }
  if (sniffed_.size() < preface.size()) return;  // a part of the preface: wait for the rest
  sniffing_ = false;
  http1_.handOver();
  received.swap(sniffed_);
  h2_ = std::make_unique<H2Session>(worker_, *transport_, peer_ip_, peer_text_, listener_);
  h2_->start(received);
}

void Connection::drain() {
  if (h2_) {
    h2_->drain();
  } else {
    http1_.drain();
  }
}

void Connection::forceClose() {
  if (h2_) {
    h2_->forceClose();
  } else {
    http1_.forceClose();
  }
}

void Connection::onReadEnd(int status) {
  if (h2_) {
    h2_->onReadEnd(status);
  } else {
    http1_.onReadEnd(status);
  }
}

void Connection::onWriteDrained() {
  if (h2_) {
    h2_->onWriteDrained();
  } else {
    http1_.onWriteDrained();
  }
}

void Connection::onWriteError(int status) {
  if (h2_) {
    h2_->onWriteError(status);
  } else {
    http1_.onWriteError(status);
  }
}

void Connection::onClosed() { delete this; }

}  // namespace sluice::downstream
