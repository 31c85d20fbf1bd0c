#!/usr/bin/env bash
# Sets up, builds the tandem CLI and runs the built-in demo: a small Qwen3-MoE made on first run
# (no download, no GPU), fine-tuned with LoRA on the bundled identity dataset, then asked
# "Who are you?" with and without the adapter. `tandem info` shows what this machine offers.
# Sets up only what that needs (Debian packages + the torch wheel): the test references and the
# llama.cpp build are scripts/test.sh's.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/scripts/setup.sh" --demo
"$repo/scripts/build.sh" tandem
"$repo/build/bin/tandem" info
exec "$repo/build/bin/tandem" demo "$@"
