#pragma once

// An HTTP/2 server written with nghttp2's server API on a FakePeer (a loopback socket of the
// test's own loop), for the tests of the HTTP/2 upstream side: the upstream connection
// (h2_upstream_connection_test) and the upstream interface over it (h2_pool_test). One session
// per connection; the test answers each request from on_request, when its END_STREAM came.

#include <doctest/doctest.h>
#include <nghttp2/nghttp2.h>
#include <uv.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/headers.h"
#include "loop_support.h"

namespace sluice::testing {

using sluice::http::Header;

inline std::string pattern(size_t size, unsigned seed) {
  std::string out(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : out) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return out;
}

inline std::string fieldValue(const std::vector<Header>& fields, std::string_view name) {
  for (const auto& h : fields) {
    if (h.name == name) return h.value;
  }
  return {};
}

// ---- the server --------------------------------------------------------------------------

struct ServerOptions {
  uint32_t max_concurrent_streams = 100;
  bool auto_ping_ack = true;
  // The server's windows open only through consume(): what the client sends beyond 64 KiB
  // waits.
  bool hold_request_window = false;
};

struct ServerStream {
  int32_t id = 0;
  std::vector<Header> fields;
  std::vector<Header> trailers;
  std::string body;
  bool headers_done = false;
  bool ended = false;  // the request's END_STREAM came
  bool closed = false;
  uint32_t close_code = 0;
  // The response being sent.
  std::string response;
  size_t offset = 0;
  std::vector<Header> response_trailers;
};

// An HTTP/2 server (nghttp2's server API) on a FakePeer: one session per connection; the test
// answers each request from on_request, when its END_STREAM came.
class H2Server {
 public:
  using Options = ServerOptions;

  explicit H2Server(uv_loop_t* loop, Options options = {}) : peer(loop), options_(options) {
    peer.on_accept = [this](FakePeer::Conn& c) { start(c); };
    peer.on_data = [this](FakePeer::Conn& c) { receive(c); };
    peer.on_eof = [this](FakePeer::Conn& c) {
      if (&c == conn_) conn_ = nullptr;
      c.close();
    };
  }
  ~H2Server() { close(); }

  void close() {
    if (session_) nghttp2_session_del(session_);
    session_ = nullptr;
    conn_ = nullptr;
    peer.close();
  }

  // Closes the connection (a FIN to the client).
  void disconnect() {
    conn_ = nullptr;
    peer.closeConnections();
  }
  void respond(int32_t id, int status, std::string body, std::vector<Header> trailers = {},
               std::vector<Header> fields = {}) {
    ServerStream& s = *streams.at(id);
    s.response = std::move(body);
    s.response_trailers = std::move(trailers);
    std::vector<Header> head = {{":status", std::to_string(status)}};
    head.insert(head.end(), fields.begin(), fields.end());
    std::vector<nghttp2_nv> nva;
    for (const auto& h : head) nva.push_back(nv(h));
    nghttp2_data_provider provider{};
    provider.source.ptr = &s;
    provider.read_callback = readResponse;
    nghttp2_submit_response(session_, id, nva.data(), nva.size(), &provider);
    flush();
  }
  // A head that ends the stream (gRPC's trailers-only answer): one HEADERS frame.
  void respondHeadOnly(int32_t id, int status, std::vector<Header> fields) {
    std::vector<Header> head = {{":status", std::to_string(status)}};
    head.insert(head.end(), fields.begin(), fields.end());
    std::vector<nghttp2_nv> nva;
    for (const auto& h : head) nva.push_back(nv(h));
    nghttp2_submit_response(session_, id, nva.data(), nva.size(), nullptr);
    flush();
  }
  // Bytes that bypass nghttp2 (frames it would never send).
  void sendRaw(std::string_view bytes) {
    if (conn_) conn_->send(bytes);
  }
  // A non-final (1xx) head.
  void informational(int32_t id, int status) {
    const Header h{":status", std::to_string(status)};
    const nghttp2_nv field = nv(h);
    REQUIRE(nghttp2_submit_headers(session_, NGHTTP2_FLAG_NONE, id, nullptr, &field, 1, nullptr) ==
            0);
    flush();
  }
  void reset(int32_t id, uint32_t code) {
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, code);
    flush();
  }
  void goaway(int32_t last_stream_id) {
    nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE, last_stream_id, NGHTTP2_NO_ERROR, nullptr,
                          0);
    flush();
  }
  void flush() {
    if (!session_ || !conn_) return;
    std::string out;
    for (;;) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(session_, &data);
      if (n <= 0) break;
      out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (!out.empty()) conn_->send(out);
  }
  // The server took `len` bytes of a request body: the client may send that many more.
  void consume(int32_t id, size_t len) {
    nghttp2_session_consume(session_, id, len);
    flush();
  }
  int32_t remoteWindow(int32_t id) const {
    return nghttp2_session_get_stream_remote_window_size(session_, id);
  }
  size_t openNow() const {
    return static_cast<size_t>(std::count_if(streams.begin(), streams.end(),
                                             [](const auto& e) { return !e.second->closed; }));
  }

  FakePeer peer;
  std::map<int32_t, std::unique_ptr<ServerStream>> streams;
  std::function<void(H2Server&, ServerStream&)> on_request;
  int pings = 0;
  size_t max_open = 0;

 private:
  static nghttp2_nv nv(const Header& h) {
    return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(h.name.data())),
                      reinterpret_cast<uint8_t*>(const_cast<char*>(h.value.data())), h.name.size(),
                      h.value.size(), NGHTTP2_NV_FLAG_NONE};
  }

  void start(FakePeer::Conn& c) {
    conn_ = &c;
    nghttp2_session_callbacks* cb = nullptr;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, onBeginHeaders);
    nghttp2_session_callbacks_set_on_header_callback(cb, onHeader);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, onFrameRecv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, onDataChunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, onStreamClose);
    nghttp2_option* option = nullptr;
    nghttp2_option_new(&option);
    if (!options_.auto_ping_ack) nghttp2_option_set_no_auto_ping_ack(option, 1);
    if (options_.hold_request_window) nghttp2_option_set_no_auto_window_update(option, 1);
    nghttp2_session_server_new2(&session_, cb, this, option);
    nghttp2_option_del(option);
    nghttp2_session_callbacks_del(cb);
    const nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams}};
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, 1);
    flush();
  }

  void receive(FakePeer::Conn& c) {
    if (!session_) return;
    const ssize_t rv = nghttp2_session_mem_recv(
        session_, reinterpret_cast<const uint8_t*>(c.in.data()), c.in.size());
    c.in.clear();
    REQUIRE(rv >= 0);
    std::vector<int32_t> ended;
    ended.swap(ended_);
    for (int32_t id : ended) {
      if (on_request) on_request(*this, *streams.at(id));
    }
    flush();
  }

  static ssize_t readResponse(nghttp2_session* session, int32_t id, uint8_t* buf, size_t length,
                              uint32_t* flags, nghttp2_data_source* source, void*) {
    auto* s = static_cast<ServerStream*>(source->ptr);
    const size_t n = std::min(length, s->response.size() - s->offset);
    std::memcpy(buf, s->response.data() + s->offset, n);
    s->offset += n;
    if (s->offset == s->response.size()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      if (!s->response_trailers.empty()) {
        *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
        std::vector<nghttp2_nv> nva;
        for (const auto& h : s->response_trailers) nva.push_back(nv(h));
        nghttp2_submit_trailer(session, id, nva.data(), nva.size());
      }
    }
    return static_cast<ssize_t>(n);
  }

  static int onBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    auto* self = static_cast<H2Server*>(user);
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    auto s = std::make_unique<ServerStream>();
    s->id = frame->hd.stream_id;
    self->streams[s->id] = std::move(s);
    self->max_open = std::max(self->max_open, self->openNow());
    return 0;
  }
  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    auto* self = static_cast<H2Server*>(user);
    auto it = self->streams.find(frame->hd.stream_id);
    if (it == self->streams.end()) return 0;
    Header h{std::string(reinterpret_cast<const char*>(name), namelen),
             std::string(reinterpret_cast<const char*>(value), valuelen)};
    (it->second->headers_done ? it->second->trailers : it->second->fields).push_back(h);
    return 0;
  }
  static int onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    auto* self = static_cast<H2Server*>(user);
    if (frame->hd.type == NGHTTP2_PING && !(frame->hd.flags & NGHTTP2_FLAG_ACK)) ++self->pings;
    auto it = self->streams.find(frame->hd.stream_id);
    if (it == self->streams.end()) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS) it->second->headers_done = true;
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
      it->second->ended = true;
      self->ended_.push_back(frame->hd.stream_id);
    }
    return 0;
  }
  static int onDataChunk(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                         void* user) {
    auto* self = static_cast<H2Server*>(user);
    auto it = self->streams.find(id);
    if (it != self->streams.end())
      it->second->body.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }
  static int onStreamClose(nghttp2_session*, int32_t id, uint32_t code, void* user) {
    auto* self = static_cast<H2Server*>(user);
    auto it = self->streams.find(id);
    if (it == self->streams.end()) return 0;
    it->second->closed = true;
    it->second->close_code = code;
    return 0;
  }

  Options options_;
  nghttp2_session* session_ = nullptr;
  FakePeer::Conn* conn_ = nullptr;
  std::vector<int32_t> ended_;
};

}  // namespace sluice::testing
