#!/usr/bin/env bash
# The Windows build of the portable engine libraries (core, io, experts; store and placement when
# their libraries exist for the target) and their unit tests, cross-compiled with mingw-w64 and run
# under wine: the proof that engine/core/platform works on Windows, not only that it compiles.
#
#   scripts/windows_cross.sh [BUILD_DIR]      (default: build-mingw in the repository; reused)
#
# Time on 2 cores: 8 min from nothing (no ccache, a fresh wine prefix), ~20 s when nothing changed.
#
# Installs nothing: it stops with the Debian packages to install when they are missing.
# Exit status: 0 when every test passed under wine, non-zero otherwise.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$repo/build-mingw}")  # wine wants an absolute WINEPREFIX
jobs=${TANDEM_JOBS:-2}

missing=()
command -v x86_64-w64-mingw32-g++-posix >/dev/null || missing+=(g++-mingw-w64-x86-64-posix)
[ -x /usr/lib/wine/wine64 ] || command -v wine64 >/dev/null || missing+=(wine64)
command -v wine >/dev/null || missing+=(wine)
[ -f /usr/src/googletest/CMakeLists.txt ] || missing+=(libgtest-dev)
[ -f /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
if [ ${#missing[@]} -gt 0 ]; then
  echo "windows_cross.sh: missing Debian packages: ${missing[*]}" >&2
  echo "  install them with: apt-get install -y --no-install-recommends ${missing[*]}" >&2
  echo "  (scripts/setup.sh installs them)" >&2
  exit 2
fi

mkdir -p "$build"
cmake -S "$repo" -B "$build" -G Ninja \
  -DCMAKE_TOOLCHAIN_FILE="$repo/cmake/mingw-w64.cmake" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANDEM_PORTABLE_ONLY=ON -DTANDEM_WERROR=ON >"$build/tandem_configure.log" 2>&1 ||
  { cat "$build/tandem_configure.log" >&2; exit 1; }
grep "Tandem portable build: left out" "$build/tandem_configure.log" || true
cmake --build "$build" -j "$jobs"

# wine: its own prefix in the build dir (created on first use, ~20 s), no display, no debug noise.
export WINEPREFIX="$build/wineprefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" DISPLAY=
export WINEARCH=win64
# Wine runs on Linux, which grants AMX only on request (arch_prctl); wine does not ask, and Windows
# 11 does not need to. So the AMX backends are capped off here; everything below AMX runs.
export TANDEM_CPU_ISA=${TANDEM_CPU_ISA:-avx512_bf16}
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  wineboot --init >/dev/null 2>&1 || true
fi
status=0
ctest --test-dir "$build" -L unit -j "$jobs" --output-on-failure || status=$?
wineserver -k >/dev/null 2>&1 || true
exit $status
