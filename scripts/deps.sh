#!/usr/bin/env bash
# Installs the Debian 12 packages Sluice needs. Safe to run again: apt-get runs only when
# something is missing.
#   scripts/deps.sh            build + test (what scripts/test.sh and scripts/run-local.sh use)
#   scripts/deps.sh build      compiler and -dev libraries only (the Dockerfile's build stage)
#   scripts/deps.sh runtime    shared libraries the binary runs with (the Dockerfile's image)
set -euo pipefail

build=(
  cmake g++ make pkg-config
  libuv1-dev libhiredis-dev libssl-dev libtomlplusplus-dev doctest-dev node-llhttp libjemalloc-dev
  nlohmann-json3-dev libspdlog-dev libcli11-dev libnghttp2-dev libyaml-cpp-dev
)
runtime=(libuv1 libhiredis0.14 libjemalloc2 libnghttp2-14 libssl3 libspdlog1.10 libfmt9 libyaml-cpp0.7 ca-certificates)
test=(
  redis-server faketime python3 python3-pytest python3-pytest-xdist python3-redis python3-yaml curl openssl
  nghttp2-client python3-h2 python3-grpcio python3-protobuf protobuf-compiler libprotobuf-dev prometheus docker-compose clang-14 libclang-rt-14-dev clang-format-14
)

case "${1:-all}" in
  build) packages=("${build[@]}") ;;
  runtime) packages=("${runtime[@]}") ;;
  all) packages=("${build[@]}" "${test[@]}") ;;
  *) echo "usage: $0 [build|runtime|all]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi
