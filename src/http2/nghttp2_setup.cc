#include "http2/nghttp2_setup.h"

#include <vector>

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

}  // namespace sluice::http2
