#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and runs each for a bounded time.
# Usage: tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET=30] [extra libFuzzer flags...]
# Exits non-zero when a target crashes (the reproducer is left in build-fuzz/artifacts/).
#
# Budget (the fuzz_parsers CTest, 2 cores): a cold build of every target takes 2 to 4 minutes
# (about 160 s of CPU, measured without ccache), and nine targets at 30 s take 4.7 minutes: the
# whole run stays under 9 minutes, with room for another target or two under 12.
set -euo pipefail

seconds="${1:-30}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TANDEM_FUZZ_BUILD_DIR:-$root/build-fuzz}"
jobs="${TANDEM_FUZZ_JOBS:-2}"

# One target a line: tests/fuzz/NAME_fuzz.cpp, seeds in tests/fuzz/corpus/NAME.
targets=(
  safetensors_header
  gguf_header
  block_table
  packed_int4
  openai_request
  http_request
  tokenizer_json
  model_config
  adapter_config
  train_config
  kt_rules
  dataset_rows
)
# The file parsers' seeds include 200 KB inputs nested past the depth limits; their mutations
# must be allowed to stay that large.
declare -A max_len=([tokenizer_json]=300000 [model_config]=300000 [adapter_config]=300000
                    [train_config]=300000 [kt_rules]=300000 [dataset_rows]=300000)

cmake -S "$root" -B "$build" -G Ninja -DTANDEM_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$build" -j "$jobs" "${targets[@]/%/_fuzz}"

mkdir -p "$build/artifacts"
status=0
for target in "${targets[@]}"; do
  seeds="$root/tests/fuzz/corpus/$target"
  # New inputs go to a scratch corpus in the build dir; the checked-in seeds stay untouched.
  work_corpus="$build/corpus/$target"
  mkdir -p "$work_corpus"
  extra_args=()
  if [[ -f "$root/tests/fuzz/$target.dict" ]]; then extra_args+=(-dict="$root/tests/fuzz/$target.dict"); fi
  if [[ -n "${max_len[$target]:-}" ]]; then extra_args+=(-max_len="${max_len[$target]}"); fi
  echo "== fuzzing $target for ${seconds}s"
  if ! "$build/tests/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="$build/artifacts/${target}-" -print_final_stats=1 "${extra_args[@]}" "$@" \
      "$work_corpus" "$seeds"; then
    echo "!! $target found a crash; reproducers are in $build/artifacts/" >&2
    status=1
  fi
done
exit "$status"
