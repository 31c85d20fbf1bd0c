#!/usr/bin/env bash
# Configures and builds Tandem with a preset of CMakePresets.json (default: "default";
# "ci" when CI=true). Extra arguments go to the build, e.g. a target name.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${TANDEM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/venv}
preset=${TANDEM_PRESET:-$([ "${CI:-}" = true ] && echo ci || echo default)}
cd "$repo"
cmake --preset "$preset" -DTANDEM_PYTHON="$venv/bin/python" >/dev/null
cmake --build --preset "$preset" -- -j"$(nproc)" "$@"
