#!/usr/bin/env bash
# Builds Tandem-Setup-<version>.exe (NSIS, runs on Windows) on Linux.
#
#   build_installer.sh --version V --rootfs PATH [--icon PATH] --out DIR
#
#   --rootfs  tandem-rootfs-<version>.tar.gz (Debian 12 minbase + tandem .deb)
#   --icon    PNG or SVG; converted to tandem.ico. Without it a plain icon is drawn.
#   --out     directory for Tandem-Setup-<version>.exe
#
# Needs: makensis (Debian: nsis), 7z (p7zip-full), convert (imagemagick);
# rsvg-convert (librsvg2-bin) for a sharp icon from an SVG.
# After building, the payload is listed with `7z l` and the script fails unless
# the rootfs, tandem.cmd, tandem.ico, wsl-setup.sh and the uninstaller are in it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

die() {
    echo "build_installer.sh: error: $*" >&2
    exit 1
}
usage() {
    sed -n '2,13s/^# \{0,1\}//p' "$0" >&2
    exit 2
}

version='' rootfs='' icon='' out=''
while [ $# -gt 0 ]; do
    case $1 in
    --version) version=${2:-} && shift 2 ;;
    --rootfs) rootfs=${2:-} && shift 2 ;;
    --icon) icon=${2:-} && shift 2 ;;
    --out) out=${2:-} && shift 2 ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2 && usage ;;
    esac
done
if [ -z "$version" ] || [ -z "$rootfs" ] || [ -z "$out" ]; then
    usage
fi
# The version ends up in a file name and in NSIS defines: keep it plain.
[[ $version =~ ^[A-Za-z0-9._+-]+$ ]] || die "--version '$version': only letters, digits and . _ + -"
[ -f "$rootfs" ] || die "--rootfs '$rootfs' is not a file"
gzip -t "$rootfs" 2>/dev/null || die "--rootfs '$rootfs' is not gzip-compressed (wsl --import wants a .tar.gz)"
[ -z "$icon" ] || [ -f "$icon" ] || die "--icon '$icon' is not a file"
for tool in makensis 7z convert; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install nsis p7zip-full imagemagick)"
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
rootfs=$(cd "$(dirname "$rootfs")" && pwd)/$(basename "$rootfs")
exe="$out/Tandem-Setup-$version.exe"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# --- tandem.ico: the sizes Windows picks from for shortcuts, taskbar, Explorer.
sizes=256,128,64,48,32,24,16
if [ -n "$icon" ]; then
    src=$icon
    case $icon in
    *.svg | *.SVG)
        # ImageMagick hands SVG to rsvg-convert at the SVG's own size (24 px for
        # resources/icons/tandem.svg) and ignores -density there, so the 256 px
        # image would be a blurry upscale. Render at 256 px ourselves.
        if command -v rsvg-convert >/dev/null; then
            rsvg-convert -w 256 -h 256 -a -b none "$icon" -o "$stage/icon.png" ||
                die "rsvg-convert could not render '$icon'"
            src=$stage/icon.png
        else
            echo "warning: rsvg-convert (librsvg2-bin) not found; the icon may be blurry" >&2
        fi
        ;;
    esac
    # Square 256 px on a transparent background, then every size into the .ico.
    convert -background none -density 1200 "$src" -resize 256x256 -gravity center \
        -extent 256x256 -define icon:auto-resize="$sizes" "$stage/tandem.ico" ||
        die "convert could not turn '$icon' into an .ico"
else
    # No icon given: two interlocking rings (the "tandem" mark), no font needed.
    convert -size 256x256 xc:none -fill none -strokewidth 22 \
        -stroke '#2b5797' -draw 'circle 92,128 92,48' \
        -stroke '#d55e00' -draw 'circle 164,128 164,48' \
        -define icon:auto-resize="$sizes" "$stage/tandem.ico" ||
        die "convert could not draw the default icon"
fi

# --- tandem.cmd: `tandem` in PowerShell/cmd. CRLF line ends: cmd.exe misparses
# some LF-only batch files.
printf '@wsl.exe -d Tandem -- tandem %%*\r\n' >"$stage/tandem.cmd"

# --- makensis. -NOCD: tandem.nsi names wsl-setup.sh relative to here, so cd.
echo "makensis: $exe"
start=$(date +%s)
(cd "$here" && makensis -V2 -INPUTCHARSET UTF8 \
    -DVERSION="$version" -DROOTFS="$rootfs" -DSTAGE="$stage" -DOUTFILE="$exe" \
    tandem.nsi) || die "makensis failed"
echo "makensis took $(($(date +%s) - start)) s"

# From here on a failure means a broken installer: don't leave it in --out.
trap 'rm -rf "$stage"; [ "$ok" = 1 ] || rm -f "$exe"' EXIT
ok=0

# --- Check the payload: 7-Zip reads NSIS installers. The uninstaller is written
# at install time by WriteUninstaller, 7z shows it as "$INSTDIR/uninstall.exe".
# `7z l -slt` gives "Path = ..." / "Packed Size = ..." blocks; turn them into
# "packed<TAB>path" rows (the "Size" field is empty for LZMA-packed entries).
listing=$(7z l -slt "$exe" | awk -F' = ' '
    /^----------$/ { files = 1; next }
    files && $1 == "Path" { path = $2 }
    files && $1 == "Packed Size" { print $2 "\t" path }') || die "7z cannot read $exe"
[ -n "$listing" ] || die "7z lists no files in $exe"
missing=()
for want in tandem-rootfs.tar.gz tandem.cmd tandem.ico wsl-setup.sh uninstall.exe; do
    awk -F'\t' -v w="$want" '{ n = split($2, p, "/") } p[n] == w { found = 1 } END { exit !found }' \
        <<<"$listing" || missing+=("$want")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "$listing" >&2
    die "$exe lacks: ${missing[*]}"
fi
# The rootfs must be stored as is (SetCompress off), not pushed through LZMA:
# its packed size in the installer equals the file's size.
want_size=$(stat -c %s "$rootfs")
got_size=$(awk -F'\t' '$2 ~ /tandem-rootfs\.tar\.gz$/ { print $1 }' <<<"$listing")
[ "$got_size" = "$want_size" ] || die "rootfs in the installer is $got_size bytes packed, the file $want_size"

echo "payload (packed bytes, path):"
awk '{ print "  " $0 }' <<<"$listing"
ok=1
echo "ok: $exe ($(du -h "$exe" | cut -f1))"
