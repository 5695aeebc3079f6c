// bench/run.sh --mode rls: a load client for unary gRPC calls over h2c, as Envoy's rate limit
// filter makes them: CONNECTIONS connections to 127.0.0.1:PORT, each with STREAMS calls in
// flight (a closed loop: a call that ends starts the next), for SECONDS; every call's request
// is the next message of BODIES (gRPC-framed messages, one after the other: a 5-byte header
// with the length, then the message), cycling. At the end it prints wrk_report.lua's WRKJSON
// line (calls as requests, latency in microseconds; a call that did not end with grpc-status 0
// counts as a status error) and a line RLSJSON with the calls answered OK and OVER_LIMIT.
//
//   rls_load PORT CONNECTIONS STREAMS SECONDS BODIES [PATH]
//
// Built by run.sh with the system's cc and libnghttp2 (Debian's libnghttp2-dev).

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNECTIONS 256

typedef struct {
  const uint8_t* data;
  size_t len;
} Body;

typedef struct {
  Body body;
  size_t sent;
  uint64_t start_ns;
  int grpc_ok;      // grpc-status 0 came
  int code;         // overall_code of the response (1 OK, 2 OVER_LIMIT), 0: none
  int got_message;  // the response's first DATA bytes were read
} Call;

typedef struct {
  int fd;
  nghttp2_session* session;
  int dead;
  int in_flight;  // calls started and not closed
} Connection;

static Body* bodies;
static size_t body_count, next_body;
static const char* path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
static char authority[64];
static uint64_t* latencies;
static size_t latency_count, latency_cap;
static uint64_t calls_ok, calls_over, errors_status, errors_read;
static int stopping;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static ssize_t send_cb(nghttp2_session* s, const uint8_t* data, size_t len, int flags, void* user) {
  (void)s;
  (void)flags;
  Connection* c = user;
  ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
  if (n < 0) return errno == EAGAIN ? NGHTTP2_ERR_WOULDBLOCK : NGHTTP2_ERR_CALLBACK_FAILURE;
  return n;
}

static ssize_t read_body(nghttp2_session* s, int32_t id, uint8_t* buf, size_t len, uint32_t* flags,
                         nghttp2_data_source* source, void* user) {
  (void)s;
  (void)id;
  (void)user;
  Call* call = source->ptr;
  size_t left = call->body.len - call->sent;
  if (len > left) len = left;
  memcpy(buf, call->body.data + call->sent, len);
  call->sent += len;
  if (call->sent == call->body.len) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)len;
}

static int start_call(Connection* c);

static int on_header(nghttp2_session* s, const nghttp2_frame* frame, const uint8_t* name,
                     size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                     void* user) {
  (void)flags;
  (void)user;
  Call* call = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
  if (call && namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
    call->grpc_ok = valuelen == 1 && value[0] == '0';
  }
  return 0;
}

static int on_data(nghttp2_session* s, uint8_t flags, int32_t id, const uint8_t* data, size_t len,
                   void* user) {
  (void)flags;
  (void)user;
  Call* call = nghttp2_session_get_stream_user_data(s, id);
  // The message after its 5-byte frame header: overall_code is field 1 (08 01 / 08 02).
  if (call && !call->got_message && len >= 7) {
    call->got_message = 1;
    if (data[5] == 0x08) call->code = data[6];
  }
  return 0;
}

static int on_close(nghttp2_session* s, int32_t id, uint32_t error, void* user) {
  Connection* c = user;
  Call* call = nghttp2_session_get_stream_user_data(s, id);
  if (!call) return 0;
  if (error != 0 || !call->grpc_ok) {
    ++errors_status;
  } else {
    if (latency_count == latency_cap) {
      latency_cap = latency_cap ? latency_cap * 2 : 1 << 20;
      latencies = realloc(latencies, latency_cap * sizeof *latencies);
      if (!latencies) abort();
    }
    latencies[latency_count++] = (now_ns() - call->start_ns) / 1000;
    if (call->code == 1) ++calls_ok;
    if (call->code == 2) ++calls_over;
  }
  free(call);
  --c->in_flight;
  if (!stopping) start_call(c);
  return 0;
}

static int start_call(Connection* c) {
  Call* call = calloc(1, sizeof *call);
  if (!call) abort();
  call->body = bodies[next_body];
  next_body = (next_body + 1) % body_count;
  call->start_ns = now_ns();
#define NV(n, v) \
  { (uint8_t*)(n), (uint8_t*)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE }
  const nghttp2_nv headers[] = {
      NV(":method", "POST"),
      NV(":scheme", "http"),
      NV(":authority", authority),
      NV(":path", path),
      NV("content-type", "application/grpc"),
      NV("te", "trailers"),
  };
  nghttp2_data_provider provider = {.source = {.ptr = call}, .read_callback = read_body};
  int32_t id = nghttp2_submit_request(c->session, NULL, headers, sizeof headers / sizeof headers[0],
                                      &provider, call);
  if (id < 0) {
    free(call);
    return -1;
  }
  ++c->in_flight;
  return 0;
}

static int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a) != 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static int cmp_u64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

static uint64_t percentile(double p) {
  if (!latency_count) return 0;
  size_t i = (size_t)(p / 100.0 * (double)(latency_count - 1) + 0.5);
  return latencies[i];
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s PORT CONNECTIONS STREAMS SECONDS BODIES [PATH]\n", argv[0]);
    return 2;
  }
  int port = atoi(argv[1]), nconn = atoi(argv[2]), streams = atoi(argv[3]);
  double seconds = atof(argv[4]);
  if (argc > 6) path = argv[6];
  if (nconn < 1 || nconn > MAX_CONNECTIONS || streams < 1 || seconds <= 0) return 2;
  snprintf(authority, sizeof authority, "127.0.0.1:%d", port);

  FILE* f = fopen(argv[5], "rb");
  if (!f) {
    perror(argv[5]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t* all = malloc((size_t)size);
  if (!all || fread(all, 1, (size_t)size, f) != (size_t)size) return 1;
  fclose(f);
  for (size_t at = 0; at + 5 <= (size_t)size;) {
    size_t len = 5 + (((size_t)all[at + 1] << 24) | ((size_t)all[at + 2] << 16) |
                      ((size_t)all[at + 3] << 8) | all[at + 4]);
    if (at + len > (size_t)size) break;
    bodies = realloc(bodies, (body_count + 1) * sizeof *bodies);
    bodies[body_count++] = (Body){all + at, len};
    at += len;
  }
  if (!body_count) {
    fprintf(stderr, "%s: no framed message\n", argv[5]);
    return 1;
  }

  nghttp2_session_callbacks* cb;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_send_callback(cb, send_cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);

  Connection conns[MAX_CONNECTIONS] = {0};
  struct pollfd fds[MAX_CONNECTIONS];
  uint64_t start = now_ns();
  for (int i = 0; i < nconn; ++i) {
    conns[i].fd = connect_to(port);
    if (conns[i].fd < 0) {
      perror("connect");
      return 1;
    }
    nghttp2_session_client_new(&conns[i].session, cb, &conns[i]);
    nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1000},
                                         {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
    nghttp2_submit_settings(conns[i].session, NGHTTP2_FLAG_NONE, settings, 2);
    for (int s = 0; s < streams; ++s) start_call(&conns[i]);
  }
  const uint64_t end = start + (uint64_t)(seconds * 1e9);
  uint8_t buf[65536];
  for (;;) {
    const uint64_t now = now_ns();
    if (!stopping && now >= end) stopping = 1;
    if (stopping && now >= end + 2000000000u) break;  // calls left after 2 s: given up
    int live = 0, busy = 0;
    for (int i = 0; i < nconn; ++i) {
      Connection* c = &conns[i];
      fds[i].fd = -1;
      if (!c->dead && nghttp2_session_send(c->session) != 0) c->dead = 1;
      if (c->dead) continue;
      ++live;
      busy += c->in_flight > 0;
      fds[i].fd = c->fd;
      fds[i].events = POLLIN | (nghttp2_session_want_write(c->session) ? POLLOUT : 0);
    }
    if (live == 0 || (stopping && busy == 0)) break;
    int n = poll(fds, (nfds_t)nconn, 100);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < nconn && n > 0; ++i) {
      Connection* c = &conns[i];
      if (c->dead || fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLERR | POLLHUP))) continue;
      for (;;) {
        ssize_t r = recv(c->fd, buf, sizeof buf, 0);
        if (r > 0) {
          if (nghttp2_session_mem_recv(c->session, buf, (size_t)r) < 0) {
            c->dead = 1;
            break;
          }
          continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          ++errors_read;
          c->dead = 1;
        }
        break;
      }
    }
  }
  const uint64_t duration_us = (now_ns() - start) / 1000;
  qsort(latencies, latency_count, sizeof *latencies, cmp_u64);
  double sum = 0;
  for (size_t i = 0; i < latency_count; ++i) sum += (double)latencies[i];
  const double mean = latency_count ? sum / (double)latency_count : 0;
  printf("%zu calls answered, %llu OK, %llu OVER_LIMIT, %llu failed\n", latency_count,
         (unsigned long long)calls_ok, (unsigned long long)calls_over,
         (unsigned long long)errors_status);
  printf(
      "WRKJSON {\"requests\":%zu,\"duration_us\":%llu,\"bytes\":0,"
      "\"errors\":{\"connect\":0,\"read\":%llu,\"write\":0,\"status\":%llu,\"timeout\":0},"
      "\"latency_us\":{\"min\":%llu,\"max\":%llu,\"mean\":%.2f,\"stdev\":0,"
      "\"p50\":%llu,\"p75\":%llu,\"p90\":%llu,\"p99\":%llu,\"p999\":%llu}}\n",
      latency_count + (size_t)errors_status, (unsigned long long)duration_us,
      (unsigned long long)errors_read, (unsigned long long)errors_status,
      (unsigned long long)percentile(0), (unsigned long long)percentile(100), mean,
      (unsigned long long)percentile(50), (unsigned long long)percentile(75),
      (unsigned long long)percentile(90), (unsigned long long)percentile(99),
      (unsigned long long)percentile(99.9));
  printf("RLSJSON {\"ok\":%llu,\"over_limit\":%llu}\n", (unsigned long long)calls_ok,
         (unsigned long long)calls_over);
  return 0;
}
