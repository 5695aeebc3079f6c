#pragma once

// The HTTP/2 codec's shared setup on libnghttp2, for Sluice's two HTTP/2 endpoints: the
// client side (downstream::H2Session) and the upstream side (upstream::H2UpstreamConnection).
// Both take the same callbacks, open windows only as their owners take the bytes (no
// automatic WINDOW_UPDATE), and send SETTINGS alike: RFC 7540 priorities off, their stream
// window and header list cap, each side's own entries, and a connection window of their own.

#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace sluice::net {
class Transport;
}

namespace sluice::http2 {

// The frame and stream events both sides handle (not_send: the client side's only).
struct Callbacks {
  nghttp2_on_begin_headers_callback begin_headers = nullptr;
  nghttp2_on_header_callback header = nullptr;
  nghttp2_on_frame_recv_callback frame_recv = nullptr;
  nghttp2_on_data_chunk_recv_callback data_chunk_recv = nullptr;
  nghttp2_on_stream_close_callback stream_close = nullptr;
  nghttp2_on_frame_send_callback frame_send = nullptr;
  nghttp2_on_frame_not_send_callback frame_not_send = nullptr;
};

enum class Role { Server, Client };

// A session for `user` (nghttp2's user_data) with `callbacks`, windows opened by hand; `option`
// (may be null) is called with the options to set more of them.
nghttp2_session* newSession(Role role, const Callbacks& callbacks, void* user,
                            void (*option)(nghttp2_option*) = nullptr);

// The first SETTINGS (priorities off, `stream_window`, `max_header_list`, then `more`) and the
// connection's receive window.
void submitSettings(nghttp2_session* session, int32_t stream_window, uint32_t max_header_list,
                    std::initializer_list<nghttp2_settings_entry> more, int32_t connection_window);

// Frames are produced only while fewer bytes than this wait for the peer; the rest stay in
// nghttp2 (whose queue of control frames unread is bounded: a peer that does not read its
// PING and SETTINGS acknowledgements is cut).
inline constexpr size_t kSendHighWater = 64 * 1024;
// Frames smaller than this are gathered into one write (one syscall) before they go out.
inline constexpr size_t kGatherBytes = 16 * 1024;

// Writes the frames nghttp2 has to send to `transport` while fewer than kSendHighWater bytes
// wait there. nghttp2 hands one frame per call, valid until the next call: small frames are
// gathered into one write (a response's HEADERS and DATA, every stream answered in one loop
// iteration), a large DATA frame is written as it is. Returns 0, or nghttp2's error (the
// session failed; what was gathered is written).
int sendFrames(nghttp2_session* session, net::Transport& transport);

}  // namespace sluice::http2
