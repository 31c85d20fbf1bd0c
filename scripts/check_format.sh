#!/usr/bin/env bash
# Checks that the C++ / CUDA sources are formatted as .clang-format says; what CI runs (the
# format_check test of the `ci` preset). clang-format 14 only: other versions break lines
# differently, so a check against them would flag code that is fine.
#
#   scripts/check_format.sh                  every tracked *.h, *.cpp, *.cu, *.cuh (less $excluded)
#   scripts/check_format.sh FILE...          these files only
#   scripts/check_format.sh --fix [FILE...]  reformat them in place instead
#   CLANG_FORMAT=PATH                        the clang-format to use (default: clang-format-14, else
#                                            clang-format)
#
# Exit status: 0 all formatted, 1 some files are not, 2 the check itself could not run.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
style="$repo/.clang-format"

# Generated files: their generator owns the layout, and a hand-formatted copy would be undone by
# the next regeneration.
excluded=(
  engine/io/tokenizer_unicode_data.h  # engine/io/tokenizer_nfc_gen.py
  third_party/cpp-httplib/httplib.h   # vendored unchanged (its README.md has the sha256)
)

files_word() { [ "$1" = 1 ] && echo "1 file" || echo "$1 files"; }

fail() {
  echo "check_format: $*" >&2
  exit 2
}

fix=0
if [ "${1:-}" = --fix ]; then
  fix=1
  shift
fi
case "${1:-}" in
  -h | --help) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 0 ;;
  -*) fail "unknown option $1 (see --help)" ;;
esac

clang_format=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
install="apt-get install clang-format-14 (Debian 12), or set CLANG_FORMAT"
[ -n "$clang_format" ] || fail "clang-format 14 not found: $install"
version=$({ "$clang_format" --version 2>/dev/null || true; } |
  sed -n 's/.*clang-format version \([0-9][0-9.]*\).*/\1/p')
[ "${version%%.*}" = 14 ] ||
  fail "$clang_format is version ${version:-unknown}, the check needs clang-format 14: $install"

files=()
if [ $# -gt 0 ]; then
  files=("$@")
else
  cd "$repo"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    while IFS= read -r -d '' f; do files+=("$f"); done \
      < <(git ls-files -z -- '*.h' '*.cpp' '*.cu' '*.cuh')
  else  # a source tarball: everything but build trees
    while IFS= read -r -d '' f; do files+=("${f#./}"); done \
      < <(find . \( -name '.*' -o -name 'build*' \) -prune -o -type f \
                 \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
  fi
  kept=()
  for f in "${files[@]}"; do
    skip=0
    for e in "${excluded[@]}"; do [ "$f" = "$e" ] && skip=1; done
    [ $skip = 1 ] || [ ! -f "$f" ] || kept+=("$f")  # tracked but deleted in the work tree: skip
  done
  files=("${kept[@]}")
fi
[ ${#files[@]} -gt 0 ] || fail "no files to check"

if [ $fix = 1 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 "$clang_format" -i --style="file:$style"
  echo "check_format: formatted $(files_word ${#files[@]}) with clang-format $version"
  exit 0
fi

# One violation per file is enough to name it (--ferror-limit=1); the messages read
# "FILE:LINE:COL: error: code should be clang-formatted [-Wclang-format-violations]". Serial (the
# whole tree takes seconds): parallel runs would interleave their unbuffered stderr.
report=$(printf '%s\0' "${files[@]}" |
  xargs -0 "$clang_format" --dry-run --Werror --ferror-limit=1 --style="file:$style" 2>&1) &&
  status=0 || status=$?
offenders=$(sed -n 's/^\(.*\):\([0-9]*\):\([0-9]*\): error: code should be clang-formatted.*/\1:\2:\3/p' \
  <<<"$report" | sort -u)
if [ -z "$offenders" ]; then
  if [ $status -ne 0 ]; then
    echo "$report" >&2
    fail "clang-format failed (status $status)"
  fi
  echo "check_format: $(files_word ${#files[@]}) formatted as .clang-format says (clang-format $version)"
  exit 0
fi

count=$(wc -l <<<"$offenders")
echo "check_format: $count of $(files_word ${#files[@]}) not formatted as .clang-format says" \
  "(clang-format $version); the first difference in each:"
sed 's/^/  /' <<<"$offenders"
names=$(sed 's/:[0-9]*:[0-9]*$//' <<<"$offenders" | tr '\n' ' ')
if [ "$count" -le 10 ]; then
  echo "To reformat them: $clang_format -i ${names% }   (or scripts/check_format.sh --fix ${names% })"
else
  echo "To reformat them: scripts/check_format.sh --fix   (clang-format -i over every checked file)"
fi
exit 1
