#!/usr/bin/env bash
# Man pages from the programs' own --help (help2man): tandem(1), tandem-<subcommand>(1) for each
# subcommand `tandem --help` lists, and tandem-studio(1) when its path is given. gzip -n, as
# Debian wants them.
#   make_manpages.sh OUT_DIR TANDEM [TANDEM_STUDIO]
set -euo pipefail
out=$1 tandem=$2 studio=${3:-}
mkdir -p "$out"
rm -f "$out"/*.1 "$out"/*.1.gz

page() {  # page NAME DESCRIPTION PROGRAM HELP_OPTION
  help2man --no-info --no-discard-stderr --section=1 --name="$2" --help-option="$4" \
    --version-option=--version --output="$out/$1.1" "$3"
  gzip -9n "$out/$1.1"
}

page tandem "fine-tune Mixture-of-Experts language models with LoRA on one machine" "$tandem" --help
# CLI11 lists subcommands as "  name  description" under "Subcommands:".
"$tandem" --help | awk '/^Subcommands:/ {on = 1; next} on && /^  [a-z]/ {print} on && /^$/ {on = 0}' |
  while read -r name description; do
    page "tandem-$name" "${description:-tandem $name}" "$tandem" "$name --help"
  done
if [ -n "$studio" ]; then
  QT_QPA_PLATFORM=offscreen page tandem-studio "the Tandem desktop app" "$studio" --help
fi
