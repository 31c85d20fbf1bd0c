#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: unit tests, parity tests against the reference
# implementations, CLI tests and the bounded fuzz run. What .ci/run and the README call.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/scripts/setup.sh"
"$repo/scripts/build.sh"
preset=${TANDEM_PRESET:-$([ "${CI:-}" = true ] && echo ci || echo default)}
cd "$repo"
ctest --preset "$preset" "$@"
