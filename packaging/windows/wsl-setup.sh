#!/bin/sh
# Runs as root INSIDE the Tandem WSL distribution; the Windows installer calls it
# through `wsl.exe -d Tandem -u root --cd <install dir> -e sh ./wsl-setup.sh ...`.
# Keeping these steps in a script (instead of `sh -c "..."` strings in the .nsi)
# avoids a second layer of quoting through wsl.exe's command line, and lets the
# steps be tested on Linux.
#
#   wsl-setup.sh backup FILE        tar /home into FILE (before an upgrade)
#   wsl-setup.sh user NAME [FILE]   create the default user NAME, restore /home
#                                   from FILE if given, write /etc/wsl.conf
#
# TANDEM_ROOT (tests only) points at a directory that stands in for /.
set -eu

root=${TANDEM_ROOT:-}

# passwd_field NAME N: field N of NAME's line in /etc/passwd (empty if no such user).
# Read the file directly rather than `id`, so that TANDEM_ROOT works without chroot.
passwd_field() {
    awk -F: -v n="$1" -v f="$2" '$1 == n { print $f }' "$root/etc/passwd"
}

case ${1:-} in
backup)
    file=$2
    # --numeric-owner: the uids are the same after re-import (first user = 1000),
    # names may not be.
    tar -C "$root/" --numeric-owner -cpf "$file" home
    ;;
user)
    name=$2
    backup=${3:-}
    # The installer already lowercased the Windows user name and dropped everything
    # outside [a-z0-9_-]; here the rest of useradd's rules: start with a letter or
    # "_", at most 32 characters. Anything else falls back to "tandem".
    if ! printf '%s\n' "$name" | grep -Eq '^[a-z_][a-z0-9_-]{0,31}$'; then
        name=tandem
    fi
    # An existing system account (root, daemon, ... — a Windows user called
    # "root" or "admin") must not become the default user; use "tandem".
    uid=$(passwd_field "$name" 3)
    if [ -n "$uid" ] && [ "$uid" -lt 1000 ]; then
        name=tandem
        uid=$(passwd_field "$name" 3)
    fi
    if [ -z "$uid" ]; then
        useradd ${root:+--root "$root"} -m -s /bin/bash "$name"
    fi
    if [ -n "$backup" ]; then
        tar -C "$root/" --numeric-owner -xpf "$backup"
        # If the Windows user name changed since the last install, the restored
        # home belongs to the old uid/name; hand the new user's home to them.
        chown -R "$(passwd_field "$name" 3):$(passwd_field "$name" 4)" "$root/home/$name"
    fi
    # Keep any other section the rootfs put in wsl.conf; replace only [user].
    conf="$root/etc/wsl.conf"
    tmp="$conf.tandem-new"
    if [ -f "$conf" ]; then
        awk '/^\[/{skip = ($0 ~ /^\[user\][[:space:]]*$/)} !skip' "$conf" >"$tmp"
    else
        : >"$tmp"
    fi
    printf '[user]\ndefault=%s\n' "$name" >>"$tmp"
    mv "$tmp" "$conf"
    echo "default user: $name"
    ;;
*)
    echo "usage: $0 backup FILE | user NAME [HOME_BACKUP]" >&2
    exit 2
    ;;
esac
