#!/usr/bin/env bash
# Sets up what Tandem needs on Debian 12, idempotently: the distribution packages and the project
# venv (the pinned torch wheel whose libtorch we link). Quick when already done: each step checks a
# stamp before working.
#
#   scripts/setup.sh --demo     what building and running Tandem needs: Debian packages + torch
#                               (scripts/demo.sh; a few minutes)
#   scripts/setup.sh            that, plus what the tests need: the reference packages (transformers,
#                               peft, gguf, ...), llama.cpp built through llama-cpp-python, and the
#                               packaging tools (scripts/test.sh)
#   TANDEM_VENV=DIR             where the venv lives (default ~/.cache/tandem/venv, shared by clones)
#
# The GGUF references come from the pinned llama-cpp-python sdist (it vendors llama.cpp): the binding is
# built from it (only the libraries the binding loads, see llama_cmake_args), and llama.cpp's converters,
# which its wheel does not ship, are copied from it into <venv>/share/llama.cpp/.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${TANDEM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/venv}
requirements="$repo/scripts/python-requirements.txt"
mode=full
[ "${1:-}" = --demo ] && mode=demo

# Building and running: compilers, Qt, the engine's libraries; help2man and rsvg-convert make the
# man pages and icons the build installs.
build_packages=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv python3-dev
  qt6-base-dev qt6-charts-dev qt6-tools-dev libqt6opengl6-dev libxkbcommon-dev
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers
  libyaml-cpp-dev libsqlite3-dev libpcre2-dev nlohmann-json3-dev libnuma-dev libcli11-dev
  libgloo-dev
  libgtest-dev libqt6svg6 zlib1g-dev help2man librsvg2-bin libcurl4-openssl-dev libssl-dev
)
# Only the tests: the fuzzers' clang, the format check, Xvfb for the studio's tests, and what the
# package test needs (a clean Debian root, lintian, the Windows cross build and installer).
test_packages=(
  clang libclang-rt-14-dev clang-format xvfb xauth imagemagick dbus-daemon
  mmdebstrap lintian dpkg-dev fakeroot nsis p7zip-full
  g++-mingw-w64-x86-64-posix wine64 wine
)
debian_packages=("${build_packages[@]}")
[ $mode = full ] && debian_packages+=("${test_packages[@]}")

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

# llama.cpp as llama-cpp-python builds it: libllama + libggml* only (no mtmd/llava, tools, examples, tests,
# server, curl or openssl), tuned for this CPU (it is built on the machine that runs it). The binding's
# CMakeLists forces LLAMA_BUILD_COMMON on (a library it does not ship or load, over half of the build): a
# project include for llama.cpp's own project() sets it off as a normal variable, which its option() then keeps
# (CMP0077). About 500 CPU-seconds instead of 1150.
llama_cmake_args="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON"

# llama-cpp-python at the pinned version, and llama.cpp's convert_hf_to_gguf.py, convert_lora_to_gguf.py,
# the conversion/ package they import and the gguf-py they put first on sys.path (newer than PyPI's gguf)
# from the same sdist's vendor/llama.cpp into <venv>/share/llama.cpp/. The 77 MB sdist is downloaded once
# for both, and only when one of them is missing or at another version.
install_llama_cpp() {
  local version dest="$venv/share/llama.cpp" have tmp top
  version=$(sed -n 's/^llama-cpp-python==//p' "$requirements")
  [ -n "$version" ] || return 0
  have=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)
  local want_pkg=1 want_conv=1
  [ "$have" = "$version" ] && want_pkg=0
  [ -f "$dest/.tandem-version" ] && [ "$(cat "$dest/.tandem-version")" = "$version" ] && want_conv=0
  [ $want_pkg = 0 ] && [ $want_conv = 0 ] && return 0
  tmp=$(mktemp -d)
  "$venv/bin/python" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version"
  if [ $want_pkg = 1 ]; then
    echo "setup: building llama-cpp-python $version (llama.cpp for this CPU, a few minutes)"
    echo 'set(LLAMA_BUILD_COMMON OFF)' > "$tmp/no-common.cmake"
    CMAKE_ARGS="$llama_cmake_args -DCMAKE_PROJECT_llama.cpp_INCLUDE=$tmp/no-common.cmake" \
      CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$venv/bin/python" -m pip install -q --no-deps "$tmp/llama_cpp_python-$version.tar.gz"
  fi
  if [ $want_conv = 1 ]; then
    echo "setup: installing llama.cpp's converters ($version) into $dest"
    top="llama_cpp_python-$version/vendor/llama.cpp"
    tar -xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp" "$top/convert_hf_to_gguf.py" \
      "$top/convert_lora_to_gguf.py" "$top/conversion" "$top/gguf-py" "$top/LICENSE"
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    mv "$tmp/$top" "$dest"
    echo "$version" > "$dest/.tandem-version"
  fi
  rm -rf "$tmp"
}

# The demo's venv: torch and its dependencies at the pinned versions, nothing else.
create_demo_venv() {
  local stamp="$venv/.tandem-requirements" torch_pin
  if [ -f "$stamp" ] && cmp -s "$stamp" "$requirements"; then return 0; fi  # the full set is there
  if [ -f "$stamp.torch" ] && cmp -s "$stamp.torch" "$requirements"; then return 0; fi
  torch_pin=$(grep '^torch==' "$requirements")
  echo "setup: creating the project venv in $venv ($torch_pin, about 3 GB)"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  grep -v '^llama-cpp-python==' "$requirements" >"$venv/.constraints"
  "$venv/bin/python" -m pip install -q -c "$venv/.constraints" "$torch_pin"
  cp "$requirements" "$stamp.torch"
}

create_venv() {
  local stamp="$venv/.tandem-requirements"
  if [ -f "$stamp" ] && cmp -s "$stamp" "$requirements"; then return 0; fi
  echo "setup: creating the project venv in $venv (torch + reference packages, a few GB)"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  install_llama_cpp   # before the requirements: they then find llama-cpp-python installed, not built from PyPI
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
if [ $mode = demo ]; then create_demo_venv; else create_venv; fi
echo "setup: done (venv: $venv)"
