#!/usr/bin/env bash
# Runs a built Tandem-Setup-*.exe silently under Wine, with a stand-in wsl.exe
# (fake-wsl.c) that logs its command line and fails on request, and checks what
# the installer and uninstaller did: which wsl.exe commands in which order, the
# files, the user PATH, the Add/Remove Programs key, the shortcuts.
#
#   test/installer_wine.sh dist/Tandem-Setup-<version>.exe
#
# Needs wine64 and gcc-mingw-w64-x86-64-win32 (Debian). This tests the
# installer's logic, not WSL: nothing is imported and no Linux runs.
set -euo pipefail

exe=$(realpath "${1:?usage: $0 Tandem-Setup-VERSION.exe}")
here=$(cd "$(dirname "$0")" && pwd)
wine=$(command -v wine64 || echo /usr/lib/wine/wine64)
[ -x "$wine" ] || { echo "installer_wine.sh: wine64 not installed" >&2; exit 2; }
command -v x86_64-w64-mingw32-gcc >/dev/null ||
    { echo "installer_wine.sh: x86_64-w64-mingw32-gcc not installed" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# HOME inside the temp dir and no menu builder: Wine must not put shortcuts or
# .desktop files into the real home.
export WINEPREFIX="$tmp/prefix" WINEDEBUG=-all HOME="$tmp/home" WINEDLLOVERRIDES="winemenubuilder.exe=d"
mkdir -p "$HOME"
"$wine" wineboot -i >/dev/null 2>&1
C="$WINEPREFIX/drive_c"
user=$(basename "$(find "$C/users" -mindepth 1 -maxdepth 1 -type d ! -name Public | head -n1)")
U="$C/users/$user"
inst="$U/AppData/Local/Tandem"
winst="C:\\users\\$user\\AppData\\Local\\Tandem"
uninst_key='HKCU\Software\Microsoft\Windows\CurrentVersion\Uninstall\Tandem'
lxss_key='HKCU\Software\Microsoft\Windows\CurrentVersion\Lxss\{00000000-test}'
x86_64-w64-mingw32-gcc -municode -O1 -o "$tmp/wsl.exe" "$here/fake-wsl.c"

failures=0
pass() { echo "  ok: $*"; }
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then pass "$what"; else fail "$what"; fi
}
reg() { "$wine" reg "$@" >/dev/null 2>&1; }
user_path() { "$wine" reg query 'HKCU\Environment' /v Path 2>/dev/null | tr -d '\r' | awk '/Path/ { $1 = $2 = ""; sub(/^ +/, ""); print }'; }
calls() { # the wsl.exe arguments, one call a line, without the exe path
    [ -f "$C/wsl-log.txt" ] || return 0
    sed -e '1s/^\xef\xbb\xbf//' -e 's/^"[^"]*wsl\.exe" //' -e 's/\r$//' "$C/wsl-log.txt"
}
install() { rm -f "$C/wsl-log.txt"; rc=0; "$wine" "$exe" /S "$@" >/dev/null 2>&1 || rc=$?; }
uninstall() {
    rm -f "$C/wsl-log.txt"
    "$wine" "$inst/uninstall.exe" /S >/dev/null 2>&1 || true
    # The uninstaller copies itself to %TEMP% and returns at once: wait for it.
    for _ in $(seq 30); do [ -f "$inst/uninstall.exe" ] || break; sleep 1; done
    sleep 1
}
wsl_fails() { echo "$2" >"$C/wsl-exit$1.txt"; }
wsl_ok() { rm -f "$C"/wsl-exit*.txt; }
has_calls() { [ "$(calls | cut -d' ' -f1-3 | tr '\n' '|')" = "$1" ]; }

echo "1. no wsl.exe: refuses, installs nothing"
install
check "exit code 2" [ "$rc" = 2 ]
check "no install dir" [ ! -e "$inst" ]

cp "$tmp/wsl.exe" "$C/windows/system32/wsl.exe"
path0="C:\\foo;C:\\bar\\"   # the user PATH before installing
reg add 'HKCU\Environment' /v Path /t REG_EXPAND_SZ /d "$path0" /f

echo "2. wsl --status fails (WSL not enabled): refuses"
wsl_fails --status 1
install
check "exit code 2" [ "$rc" = 2 ]
check "only --status was run" has_calls "--status|"
wsl_ok

echo "3. wsl --version fails (old inbox WSL): refuses"
wsl_fails --version 1
install
check "exit code 2" [ "$rc" = 2 ]
check "no install dir" [ ! -e "$inst" ]
wsl_ok

echo "4. import fails: nothing left behind"
wsl_fails --import 5
install
check "exit code 2" [ "$rc" = 2 ]
check "no install dir" [ ! -e "$inst" ]
check "PATH untouched" [ "$(user_path)" = "$path0" ]
wsl_ok

echo "5. fresh install"
install
check "exit code 0" [ "$rc" = 0 ]
check "wsl calls: status, version, import, user setup, terminate" \
    has_calls "--status|--version|--import Tandem \"$winst\\wsl\"|-d Tandem -u|--terminate Tandem|"
check "import into %LOCALAPPDATA%\\Tandem\\wsl" grep -qF -- "--import Tandem \"$winst\\wsl\" \"" <(calls)
check "import of the rootfs as WSL 2" grep -q -- 'tandem-rootfs\.tar\.gz" --version 2$' <(calls)
check "user setup runs wsl-setup.sh as root in the install dir" \
    grep -qF -- "-d Tandem -u root --cd \"$winst\" -e sh ./wsl-setup.sh user " <(calls)
for f in tandem.cmd tandem.ico wsl-setup.sh uninstall.exe; do
    check "$f installed" [ -f "$inst/$f" ]
done
check "rootfs not left in the install dir" [ -z "$(find "$inst" -name '*.tar.gz')" ]
check "install dir appended to the user PATH" [ "$(user_path)" = "C:\\foo;C:\\bar\\;$winst" ]
check "Add/Remove Programs entry (HKCU)" reg query "$uninst_key" /v UninstallString
check "Start menu shortcut" [ -f "$U/AppData/Roaming/Microsoft/Windows/Start Menu/Programs/Tandem Studio.lnk" ]
check "desktop shortcut" [ -f "$U/Desktop/Tandem Studio.lnk" ]

echo "6. reinstall without a registered distribution: PATH entry not doubled"
install
check "exit code 0" [ "$rc" = 0 ]
check "PATH has the entry once" [ "$(user_path)" = "C:\\foo;C:\\bar\\;$winst" ]

reg add "$lxss_key" /v DistributionName /d Tandem /f

echo "7. existing distribution, silent without /UPGRADE: changes nothing"
install
check "exit code 2" [ "$rc" = 2 ]
check "no unregister/import" has_calls "--status|--version|"

echo "8. /UPGRADE=keep, but copying /home out fails: changes nothing"
wsl_fails -d 3
install /UPGRADE=keep
check "exit code 2" [ "$rc" = 2 ]
check "backup tried, no unregister" has_calls "--status|--version|-d Tandem -u|"
wsl_ok

echo "9. /UPGRADE=keep"
install /UPGRADE=keep
check "exit code 0" [ "$rc" = 0 ]
check "backup, unregister, import, user setup with the backup, terminate" \
    has_calls "--status|--version|-d Tandem -u|--unregister Tandem|--import Tandem \"$winst\\wsl\"|-d Tandem -u|--terminate Tandem|"
check "backup then restore of home-backup.tar" \
    [ "$(calls | grep -c 'wsl-setup.sh .*home-backup.tar$')" = 2 ]

echo "10. /UPGRADE=discard"
install /UPGRADE=discard
check "exit code 0" [ "$rc" = 0 ]
check "unregister, import, user setup, terminate" \
    has_calls "--status|--version|--unregister Tandem|--import Tandem \"$winst\\wsl\"|-d Tandem -u|--terminate Tandem|"

echo "11. uninstall"
uninstall
check "unregisters the distribution" has_calls "--unregister Tandem|"
check "install dir gone" [ ! -e "$inst" ]
check "PATH entry removed" [ "$(user_path)" = "$path0" ]
check "Add/Remove Programs entry removed" bash -c "! \"$wine\" reg query '$uninst_key' >/dev/null 2>&1"
check "shortcuts removed" [ -z "$(find "$U" -name 'Tandem Studio.lnk')" ]

echo
if [ "$failures" -gt 0 ]; then
    echo "installer_wine.sh: $failures check(s) FAILED"
    exit 1
fi
echo "installer_wine.sh: all checks pass ($("$wine" --version))"
