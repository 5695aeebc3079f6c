#include "http1/response_encoder.h"

#include <utility>

#include "net/transport.h"

namespace sluice::http1 {

void ResponseEncoder::gatherOwned(std::string piece) {
  owned_.push_back(std::move(piece));
  pieces_.push_back(owned_.back());
}

void ResponseEncoder::flush() {
  if (!pieces_.empty()) transport_.writev(pieces_.data(), pieces_.size());
  discard();
}

void ResponseEncoder::discard() {
  pieces_.clear();
  owned_.clear();
}

size_t ResponseEncoder::writeContinue() {
  const std::string_view text = http::continueResponse();
  transport_.write(text);
  return text.size();
}

size_t ResponseEncoder::writeHead(const http::MessageHead& response, std::string_view extra_headers,
                                  bool head_request, bool client_http10, bool& keep_alive) {
  discard();
  framing_ = http::responseFraming(response, head_request, client_http10);
  keep_alive = keep_alive && framing_ != http::Framing::CloseDelimited;
  http::ClientResponseContext context;
  context.client_http10 = client_http10;
  context.keep_alive = keep_alive;
  context.framing = framing_;
  context.extra_headers = extra_headers;
  gatherOwned(http::buildClientResponseHead(response, context));
  return owned_.back().size();
}

size_t ResponseEncoder::writeBody(std::string_view data) {
  if (data.empty()) return 0;
  if (framing_ != http::Framing::Chunked) {
    gather(data);
    return data.size();
  }
  gatherOwned(http::chunkHeader(data.size()));
  gather(data);
  gather(http::kChunkEnd);
  return owned_.back().size() + data.size() + http::kChunkEnd.size();
}

size_t ResponseEncoder::end(const http::HeaderMap& trailers) {
  if (framing_ == http::Framing::Chunked) {
    if (trailers.empty()) {
      gather(http::kLastChunk);
    } else {
      gatherOwned(http::lastChunk(trailers));
    }
  }
  const size_t last = framing_ == http::Framing::Chunked ? pieces_.back().size() : 0;
  flush();
  framing_ = http::Framing::None;
  return last;
}

size_t ResponseEncoder::writeLocal(const http::LocalResponse& response, bool keep_alive,
                                   bool head_request, bool client_http10) {
  discard();
  framing_ = http::Framing::None;
  const std::string text =
      http::renderLocalResponse(response, keep_alive, head_request, client_http10);
  transport_.write(text);
  return text.size();
}

size_t ResponseEncoder::writeSwitchingProtocols(const http::MessageHead& response,
                                                bool client_http10) {
  discard();
  framing_ = http::Framing::None;
  http::ClientResponseContext context;
  context.client_http10 = client_http10;
  context.tunnel = true;
  context.keep_alive = true;
  context.framing = http::Framing::None;
  const std::string text = http::buildClientResponseHead(response, context);
  transport_.write(text);
  return text.size();
}

}  // namespace sluice::http1
