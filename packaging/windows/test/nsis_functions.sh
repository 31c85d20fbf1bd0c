#!/usr/bin/env bash
# Compiles functions.nsi (tandem-lib.nsh's LinuxUserName and PathWithout
# on fixed inputs) and, where Wine is installed, runs it and checks the output.
# Without Wine it only checks that the functions compile, and says so.
#   packages: nsis; to run: wine64 (Debian: /usr/lib/wine/wine64)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd "$here" && makensis -V1 -DOUTFILE="$tmp/functions-test.exe" functions.nsi)

wine=$(command -v wine64 || true)
[ -n "$wine" ] || { [ -x /usr/lib/wine/wine64 ] && wine=/usr/lib/wine/wine64; } || true
if [ -z "$wine" ]; then
    echo "nsis_functions.sh: compiled; Wine not installed, functions NOT run"
    exit 0
fi
export WINEPREFIX="$tmp/prefix" WINEDEBUG=-all WINEDLLOVERRIDES="winemenubuilder.exe=d" HOME="$tmp"
"$wine" "$tmp/functions-test.exe" 2>/dev/null || { echo "functions-test.exe failed" >&2; exit 1; }
# The results are UTF-16LE with CRLF (FileWriteUTF16LE).
got=$(iconv -f UTF-16LE -t UTF-8 "$tmp/functions-result.txt" | tr -d '\r')
want=$(cat <<'WANT'
user|JDoe|jdoe
user|Jöhn Doe-X|jhndoe-x
user|maria.lopez|marialopez
user|李雷|tandem
user|user_1|user_1
user|ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijkl|abcdefghijklmnopqrstuvwxyzabcdef
path|C:\foo;C:\T;C:\bar|C:\T|C:\foo;C:\bar
path|C:\T|C:\T|
path|c:\t\;C:\foo|C:\T|C:\foo
path|C:\foo;;C:\bar;|C:\T|C:\foo;;C:\bar;
path|C:\foo;C:\T;C:\T\;C:\Tx|C:\T|C:\foo;C:\Tx
path||C:\T|
path|%USERPROFILE%\bin;C:\T|C:\T|%USERPROFILE%\bin
WANT
)
if [ "$got" != "$want" ]; then
    diff <(echo "$want") <(echo "$got") >&2 || true
    echo "nsis_functions.sh: FAILED (< expected, > got)" >&2
    exit 1
fi
echo "nsis_functions.sh: all $(wc -l <<<"$want") cases pass (Wine $("$wine" --version 2>/dev/null || echo '?'))"
