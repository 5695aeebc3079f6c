#pragma once

// HTTP/1.1 responses on the wire (RFC 9112): a response head and its body, framed for one
// client (the upstream's Content-Length kept, a body re-chunked, or delimited by the close for
// an HTTP/1.0 client), 100 Continue, Sluice's own answers, and a 101 before a tunnel. What the
// exchange hands over as fields and body bytes becomes text here; nothing else writes HTTP/1.1
// responses.
//
// Body pieces of one upstream read are gathered (views, plus the chunk headers this encoder
// owns) and written with one writev by flush(). Each call returns the bytes it puts on the
// wire, what the client receives.

#include <cstddef>
#include <list>
#include <string>
#include <string_view>
#include <vector>

#include "http/forwarding.h"
#include "http/message.h"
#include "http/responses.h"

namespace sluice::net {
class Transport;
}

namespace sluice::http1 {

class ResponseEncoder {
 public:
  explicit ResponseEncoder(net::Transport& transport) : transport_(transport) {}

  size_t writeContinue();
  // The upstream's head (not a 101). keep_alive: whether the connection may carry another
  // request; cleared when the body must end with the close (no length, an HTTP/1.0 client).
  // Gathered with the body that follows.
  size_t writeHead(const http::MessageHead& response, std::string_view extra_headers,
                   bool head_request, bool client_http10, bool& keep_alive);
  // `data` must stay valid until flush() or end().
  size_t writeBody(std::string_view data);
  void flush();
  // The last chunk, with the forwardable trailers, for a chunked body; then flush().
  size_t end(const http::HeaderMap& trailers);
  // Sluice's own answer, whole, at once.
  size_t writeLocal(const http::LocalResponse& response, bool keep_alive, bool head_request,
                    bool client_http10);
  // The 101 before a tunnel, at once.
  size_t writeSwitchingProtocols(const http::MessageHead& response, bool client_http10);
  // Whatever was gathered and not flushed is dropped (its views may point into a buffer that
  // is gone): between two responses, and when the connection closes.
  void discard();

 private:
  void gather(std::string_view piece) { pieces_.push_back(piece); }
  void gatherOwned(std::string piece);

  net::Transport& transport_;
  http::Framing framing_ = http::Framing::None;
  std::vector<std::string_view> pieces_;
  // Owned heads and chunk headers, at stable addresses (a list: a deque allocates its map and
  // a block even when empty).
  std::list<std::string> owned_;
};

}  // namespace sluice::http1
