#!/usr/bin/env bash
# Sets up everything Tandem needs on Debian 12, idempotently: the distribution packages, the
# project venv (pinned torch whose libtorch we link + the reference packages the tests use) and a
# configured build tree. Quick when already done: each step checks a stamp before working.
#
#   scripts/setup.sh            packages + venv + configure build/ (the default preset)
#   TANDEM_VENV=DIR             where the venv lives (default ~/.cache/tandem/venv, shared by clones)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${TANDEM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/venv}
requirements="$repo/scripts/python-requirements.txt"

debian_packages=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv python3-dev
  clang libclang-rt-14-dev
  qt6-base-dev qt6-charts-dev qt6-tools-dev libqt6opengl6-dev libxkbcommon-dev
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers
  libyaml-cpp-dev libsqlite3-dev libpcre2-dev nlohmann-json3-dev libnuma-dev libcpp-httplib-dev libcli11-dev
  libgtest-dev xvfb xauth imagemagick
  libqt6svg6 zlib1g-dev
)

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_debian_packages() {
  local missing=()
  for p in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

create_venv() {
  local stamp="$venv/.tandem-requirements"
  if [ -f "$stamp" ] && cmp -s "$stamp" "$requirements"; then return 0; fi
  echo "setup: creating the project venv in $venv (torch + reference packages, a few GB)"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$requirements"
  # Second versions the compatibility tests use (e.g. peft 0.21 changed its fused-expert layout).
  grep '^# compat: ' "$requirements" | sed 's/^# compat: //' | while read -r pin; do
    local name=${pin%%==*}
    rm -rf "$venv/compat/$name"
    "$venv/bin/python" -m pip install -q --no-deps --target "$venv/compat/$name" "$pin"
  done
  cp "$requirements" "$stamp"
}

install_debian_packages
create_venv
echo "setup: done (venv: $venv)"
