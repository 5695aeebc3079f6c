#!/usr/bin/env bash
# Installs the Debian 12 packages Sluice builds, runs and tests with. Safe to run again: it
# only calls apt-get when something is missing.
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libuv1-dev libhiredis-dev libssl-dev libtomlplusplus-dev doctest-dev node-llhttp
  nlohmann-json3-dev libspdlog-dev libcli11-dev
  redis-server python3 python3-pytest python3-redis curl openssl
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
