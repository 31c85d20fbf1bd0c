#!/usr/bin/env bash
# Sets up, builds the tandem CLI and runs the main job. Until training lands that is
# `tandem info`: what this machine offers Tandem.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/scripts/setup.sh"
"$repo/scripts/build.sh" tandem
exec "$repo/build/bin/tandem" info "$@"
