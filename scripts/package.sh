#!/usr/bin/env bash
# Builds the Linux packages (tandem_<version>_amd64.deb, tandem-<version>-linux-x86_64.tar.gz), the
# WSL rootfs (Debian 12 minbase with the .deb installed) and the Windows installer from a configured
# build tree, and with --test proves them on a clean Debian 12 root. packaging/README.md says why.
#
#   scripts/package.sh [--test] [--no-windows] [BUILD_DIR]
#     BUILD_DIR   a configured tree (default: the preset's, build/); its packages go to BUILD_DIR/packages
#     --test      the installer's logic under Wine; lintian; then in a fresh bookworm minbase root where
#                 apt installed the .deb (so a missing Depends: fails), as an unprivileged user: tandem
#                 --version, tandem info --json, tandem demo, tandem-studio --screenshot-tour under
#                 Xvfb; purge; nothing of the package may be left
#     --no-windows  skip the rootfs and the installer
#
# Needs root (the clean root is a chroot), mmdebstrap, lintian, dpkg-dev; the installer needs nsis,
# p7zip-full, imagemagick, librsvg2-bin, and its test wine64 and the mingw-w64 compiler. The Debian mirror is the host's (/etc/apt/sources.list.d/debian.sources).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
test_it=0 windows=1 build=
for arg in "$@"; do
  case $arg in
    --test) test_it=1 ;;
    --no-windows) windows=0 ;;
    -*) echo "package.sh: unknown option $arg" >&2; exit 2 ;;
    *) build=$arg ;;
  esac
done
build=$(cd "${build:-$repo/build}" && pwd)
if [ $test_it = 1 ] && [ "$(id -u)" -ne 0 ]; then
  echo "package.sh: --test needs root (it installs into a chroot); skipped" >&2
  exit 77
fi
[ -f "$build/CPackConfig.cmake" ] || { echo "package.sh: $build is not a configured build tree (run scripts/build.sh)" >&2; exit 2; }
out="$build/packages"
log() { echo "package: $*"; }

# --- the packages ------------------------------------------------------------------------------
log "building the programs, man pages, icons and completion in $build"
targets=(tandem tandem_changelog)
grep -q '^build tandem_package_assets:' "$build/build.ninja" && targets+=(tandem_package_assets)
grep -q '^TANDEM_WITH_UI:BOOL=ON' "$build/CMakeCache.txt" && targets+=(tandem-studio)
cmake --build "$build" --target "${targets[@]}" -- -j"$(nproc)"
rm -rf "$out"
(cd "$build" && cpack -G "DEB;TGZ" >"$build/cpack.log" 2>&1) || { cat "$build/cpack.log" >&2; exit 1; }
deb=$(ls "$out"/*.deb)
version=$(dpkg-deb -f "$deb" Version)
package=$(dpkg-deb -f "$deb" Package)
log "made $(ls "$out" | grep -E '\.(deb|tar\.gz)$' | tr '\n' ' ')"
log "Depends: $(dpkg-deb -f "$deb" Depends)"
log "installed size: $(dpkg-deb -f "$deb" Installed-Size) KiB; .deb $(du -m "$deb" | cut -f1) MB"

sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
rootfs="$out/$package-rootfs-$version.tar.gz"
if [ $windows = 1 ] || [ $test_it = 1 ]; then
  log "making $rootfs: Debian 12 minbase + apt-get install $(basename "$deb")"
  mmdebstrap --quiet --variant=minbase --aptopt='Acquire::Check-Valid-Until "false"' \
    --customize-hook="copy-in '$deb' /tmp" \
    --customize-hook="chroot \"\$1\" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends /tmp/$(basename "$deb")" \
    --customize-hook='rm -f "$1"/tmp/*.deb' \
    bookworm "$rootfs" "$sources"
fi

if [ $windows = 1 ]; then
  "$repo/packaging/windows/build_installer.sh" --version "$version" --rootfs "$rootfs" \
    --icon "$repo/resources/icons/tandem.svg" --out "$out"
fi

[ $test_it = 1 ] || exit 0

# --- the test ------------------------------------------------------------------------------------
if [ $windows = 1 ]; then
  # The installer's logic under Wine with a stand-in wsl.exe, on a small copy (a tiny rootfs): the
  # real one's payload was checked above; unpacking 300 MB in each of eleven scenarios adds nothing.
  log "the Windows installer's helpers and its silent runs under Wine"
  "$repo/packaging/windows/test/nsis_functions.sh"
  mini=$(mktemp -d)
  mkdir "$mini/root" && echo tandem >"$mini/root/marker" && tar -czf "$mini/rootfs.tar.gz" -C "$mini/root" .
  "$repo/packaging/windows/build_installer.sh" --version "$version" --rootfs "$mini/rootfs.tar.gz" \
    --icon "$repo/resources/icons/tandem.svg" --out "$mini" >/dev/null
  "$repo/packaging/windows/test/installer_wine.sh" "$mini/Tandem-Setup-$version.exe"
  rm -rf "$mini"
fi

log "lintian"
lintian --fail-on error "$deb"

root=$(mktemp -d /tmp/tandem-package-test.XXXXXX)
cleanup() {
  for m in dev/pts dev proc sys; do mountpoint -q "$root/$m" && umount -l "$root/$m"; done
  rm -rf "$root"
}
trap cleanup EXIT
tar -xzf "$rootfs" -C "$root"
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
as_user() { in_root su - tester -c "$*"; }

log "in a clean root, as an unprivileged user"
in_root useradd -m -s /bin/bash tester
in_root apt-get update -qq
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends xvfb xauth >/dev/null
as_user 'tandem --version'
as_user 'tandem info --json' >"$root/tmp/info.json"
python3 -c 'import json, sys; i = json.load(open(sys.argv[1])); assert i["ram"]["total_bytes"] > 0 and i["torch"]["version"] and i["cpu"]["logical_cpus"] > 0, i' "$root/tmp/info.json"
as_user 'tandem demo'
if [ -x "$root/usr/bin/tandem-studio" ]; then
  as_user 'xvfb-run -a -s "-screen 0 1280x800x24" tandem-studio --screenshot-tour shots --tour-steps 2'
  shots=$(find "$root/home/tester/shots" -name '*.png' -size +1k | wc -l)
  [ "$shots" -gt 0 ] || { echo "package.sh: the screenshot tour saved no screenshot" >&2; exit 1; }
  log "screenshot tour: $shots screenshots"
fi

log "purge"
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' | grep -v '/$' >"$root/tmp/package-files"
in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "$package" >/dev/null
left=
while read -r f; do
  if [ -e "$root$f" ] || [ -L "$root$f" ]; then left+=" $f"; fi
done <"$root/tmp/package-files"
for d in /usr/lib/x86_64-linux-gnu/tandem /usr/share/tandem /usr/share/doc/tandem; do
  if [ -e "$root$d" ]; then left+=" $d"; fi
done
if [ -n "${left// /}" ]; then
  echo "package.sh: dpkg --purge left files of the package behind:" $left >&2
  exit 1
fi
[ -d "$root/home/tester/.local/share/tandem" ] || { echo "package.sh: the demo's run store is gone after purge (the user's files must stay)" >&2; exit 1; }
log "ok: installed, ran, purged without a trace; the user's run store is kept"
