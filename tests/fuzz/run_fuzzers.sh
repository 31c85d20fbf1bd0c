#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and runs each for a bounded time.
# Usage: tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET=60] [extra libFuzzer flags...]
# Exits non-zero when a target crashes (the reproducer is left in build-fuzz/artifacts/).
set -euo pipefail

seconds="${1:-60}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TANDEM_FUZZ_BUILD_DIR:-$root/build-fuzz}"
jobs="${TANDEM_FUZZ_JOBS:-2}"

cmake -S "$root" -B "$build" -G Ninja -DTANDEM_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$build" -j "$jobs" safetensors_header_fuzz gguf_header_fuzz openai_request_fuzz http_request_fuzz

mkdir -p "$build/artifacts"
status=0
for target in safetensors_header gguf_header openai_request http_request; do
  seeds="$root/tests/fuzz/corpus/$target"
  # New inputs go to a scratch corpus in the build dir; the checked-in seeds stay untouched.
  work_corpus="$build/corpus/$target"
  mkdir -p "$work_corpus"
  dict_args=()
  if [[ -f "$root/tests/fuzz/$target.dict" ]]; then dict_args=(-dict="$root/tests/fuzz/$target.dict"); fi
  echo "== fuzzing $target for ${seconds}s"
  if ! "$build/tests/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="$build/artifacts/${target}-" -print_final_stats=1 "${dict_args[@]}" "$@" \
      "$work_corpus" "$seeds"; then
    echo "!! $target found a crash; reproducers are in $build/artifacts/" >&2
    status=1
  fi
done
exit "$status"
