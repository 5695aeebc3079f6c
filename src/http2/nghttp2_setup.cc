#include "http2/nghttp2_setup.h"

#include <string>
#include <string_view>
#include <vector>

#include "net/transport.h"

namespace sluice::http2 {

nghttp2_session* newSession(Role role, const Callbacks& callbacks, void* user,
                            void (*option)(nghttp2_option*)) {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, callbacks.begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cb, callbacks.header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, callbacks.frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, callbacks.data_chunk_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, callbacks.stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cb, callbacks.frame_send);
  if (callbacks.frame_not_send) {
    nghttp2_session_callbacks_set_on_frame_not_send_callback(cb, callbacks.frame_not_send);
  }
  nghttp2_option* options = nullptr;
  nghttp2_option_new(&options);
  // Windows open only as the owners take the bytes: a side never holds more than its windows.
  nghttp2_option_set_no_auto_window_update(options, 1);
  if (option) option(options);
  nghttp2_session* session = nullptr;
  if (role == Role::Server) {
    nghttp2_session_server_new2(&session, cb, user, options);
  } else {
    nghttp2_session_client_new2(&session, cb, user, options);
  }
  nghttp2_option_del(options);
  nghttp2_session_callbacks_del(cb);
  return session;
}

void submitSettings(nghttp2_session* session, int32_t stream_window, uint32_t max_header_list,
                    std::initializer_list<nghttp2_settings_entry> more, int32_t connection_window) {
  std::vector<nghttp2_settings_entry> settings = {
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(stream_window)},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, max_header_list},
      {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
  };
  settings.insert(settings.end(), more.begin(), more.end());
  nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings.data(), settings.size());
  nghttp2_session_set_local_window_size(session, NGHTTP2_FLAG_NONE, 0, connection_window);
}

int sendFrames(nghttp2_session* session, net::Transport& transport) {
  // One buffer per thread, kept from call to call; a call made from inside another (a
  // transport's callback that sends on another session) gathers in its own.
  thread_local std::string buffer;
  thread_local bool buffer_in_use = false;
  std::string nested;
  const bool outermost = !buffer_in_use;
  std::string& gathered = outermost ? buffer : nested;
  buffer_in_use = true;
  gathered.clear();
  int rv = 0;
  while (transport.pendingBytes() + gathered.size() < kSendHighWater) {
    const uint8_t* data = nullptr;
    const ssize_t n = nghttp2_session_mem_send(session, &data);
    if (n < 0) {
      rv = static_cast<int>(n);
      break;
    }
    if (n == 0) break;
    const std::string_view frame(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    if (gathered.empty() && frame.size() >= kGatherBytes) {
      transport.write(frame);  // a large DATA frame goes as it is
      continue;
    }
    gathered.append(frame);
    if (gathered.size() >= kGatherBytes) {
      transport.write(gathered);
      gathered.clear();
    }
  }
  if (!gathered.empty()) transport.write(gathered);
  gathered.clear();
  if (outermost) buffer_in_use = false;
  return rv;
}

}  // namespace sluice::http2
