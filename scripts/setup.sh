#!/usr/bin/env bash
# Install what the build needs (Debian bookworm packages; as root, or through
# sudo) and build metrale into build/. Extra CMake arguments: METRALE_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build catch2 librapidcheck-dev libeigen3-dev libspdlog-dev libfmt-dev
          libcli11-dev nlohmann-json3-dev python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# shellcheck disable=SC2086  # METRALE_CMAKE_ARGS is a list of arguments
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${METRALE_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
