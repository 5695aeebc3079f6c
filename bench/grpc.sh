# shellcheck shell=bash disable=SC2034,SC2004
# (GW_* are run.sh's associative arrays.)
# bench/run.sh --mode grpc: unary gRPC calls through Sluice and through nginx `grpc_pass`, h2c
# on both sides (see "gRPC" in bench/README.md). Sourced by run.sh after h2.sh, whose h2load
# rounds and report it uses (run_h2load takes H2LOAD_ARGS and H2LOAD_PATH).
#
# The origin is an h2c server of the upstream nginx that answers every call to
# /bench.Echo/Call with a gRPC reply: 200, content-type application/grpc, one empty message
# (the 5 bytes of a message frame of length 0) and the trailer grpc-status 0. (A POST to a
# static file is a 405 in nginx: error_page turns it into the file, re-asked with GET.) It
# answers GET / with "ok" for the readiness checks. nginx-grpc and Sluice proxy to it, each
# with its pooled h2c connections; h2load sends each call's request message (7 bytes of
# protobuf in a 12-byte frame) with content-type application/grpc and te: trailers.

GRPC_VARIANTS="nginx-grpc sluice sluice+mix"
GRPC_SHAPES=${BENCH_GRPC_SHAPES:-c10m10 c50m1}
GRPC_PATH=/bench.Echo/Call

# Targets (issue 27), Sluice (no limit) against nginx-grpc on every shape.
GRPC_RPS_RATIO_MIN=1.0
GRPC_P99_RATIO_MAX=1.2

# The origin's gRPC server, inside run.sh's upstream nginx (start_upstream). $1 = its dir.
grpc_origin_server() {
  local d=$1
  next_port; UPSTREAM_GRPC_PORT=$PORT_OUT
  mkdir -p "$d/grpc"
  printf '\0\0\0\0\0' >"$d/grpc/reply"  # one message frame: not compressed, length 0
  cat <<EOF
    server {  # gRPC over h2c: every call answered with an empty message and grpc-status 0
        listen 127.0.0.1:$UPSTREAM_GRPC_PORT http2 backlog=4096;
        location = / { return 200 "ok"; }
        location / {
            root $d/grpc;
            default_type application/grpc;
            try_files /reply =404;
            error_page 405 =200 /reply;
            add_trailer grpc-status 0;
        }
    }
EOF
}

# The request message of every call: field 1 (a string) "bench", in one frame.
grpc_request_file() {
  GRPC_REQUEST=$WORK/grpc-request.bin
  printf '\0\0\0\0\007\012\005bench' >"$GRPC_REQUEST"
  H2LOAD_ARGS=(-d "$GRPC_REQUEST" -H "content-type: application/grpc" -H "te: trailers")
  H2LOAD_PATH=$GRPC_PATH
}

variant_nginx_grpc() {  # nginx, HTTP/2 in clear, grpc_pass with pooled h2c connections
  nginx_proxy "$1" grpc
}

# Before the rounds: the tenant in Valkey and its check (h2_prepare: first, or a call made
# before would have Sluice cache the key as a tenant's that is not there), then one call
# through every gateway, checked (200, content-type, the reply's frame, grpc-status 0 in the
# trailers): a gateway that does not pass the call as gRPC fails the run here, not in its
# figures.
grpc_prepare() {
  local v
  h2_prepare
  for v in $VARIANTS; do
    "${HELPER[@]}" grpc-call --port "${GW_PORT[$v]}" --path "$GRPC_PATH" \
      --headers "x-forwarded-for: $H2_CLIENT_ADDRESS" "x-api-key: $H2_API_KEY" \
      || die "$v does not pass a gRPC call (see above)"
  done
}

grpc_report() {  # $1 = meta JSON, $2 = summary JSON to write
  "${HELPER[@]}" h2-report --dir "$OUT" --variants "$VARIANTS" --reference "$REFERENCE" \
    --shapes "$H2_SHAPES" --rounds "$ROUNDS" --meta "$1" --mode grpc \
    --rps-ratio-min "$GRPC_RPS_RATIO_MIN" --p99-ratio-max "$GRPC_P99_RATIO_MAX" --out "$2"
}
