#!/usr/bin/env bash
# Installs what sbxfs and its tests need on Debian/Ubuntu, as root:
# fuse3 (fusermount3, mount.fuse3), attr, acl, git, fio, fuse-overlayfs, rsync,
# sqlite3, vim-tiny (the editor tests), npm (unless one is installed),
# gnuplot-nox (the charts of
# scripts/bench), e2fsprogs and mount (the tests on loop-mounted ext4
# images), util-linux (taskset, fsfreeze), and user_allow_other in
# /etc/fuse.conf (so non-root users may use --allow-other). Idempotent:
# installs only what is missing, runs apt-get update only when it has to,
# and says what it did.
set -euo pipefail

packages=(fuse3 attr acl git fio fuse-overlayfs rsync sqlite3 vim-tiny gnuplot-nox e2fsprogs mount util-linux python3-venv)
fuse_conf=/etc/fuse.conf

say() { printf 'install-deps: %s\n' "$*"; }

if [[ $(id -u) -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1; then
		say "not root: re-running with sudo"
		exec sudo --preserve-env=PATH "$0" "$@"
	fi
	say "must run as root (apt-get install, $fuse_conf)" >&2
	exit 1
fi

missing=()
for p in "${packages[@]}"; do
	if dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed'; then
		:
	else
		missing+=("$p")
	fi
done
# npm (TestRealNpmDeadPathsDropped): Debian's package only where no npm
# is installed at all (nodesource's nodejs brings its own, which Debian's
# npm would conflict with).
if ! command -v npm >/dev/null 2>&1; then
	packages+=(npm)
	missing+=(npm)
fi

# apt_lists_fresh: the package lists exist and are less than a day old.
apt_lists_fresh() {
	[[ -n $(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mtime -1 -print -quit 2>/dev/null) ]]
}

if ((${#missing[@]} == 0)); then
	say "packages already installed: ${packages[*]}"
else
	export DEBIAN_FRONTEND=noninteractive
	if ! apt_lists_fresh; then
		say "apt-get update (package lists missing or older than a day)"
		apt-get update -qq
	fi
	say "installing: ${missing[*]}"
	if ! apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
		say "install failed; apt-get update and retry"
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}"
	fi
	say "installed: ${missing[*]}"
fi

if [[ -f $fuse_conf ]] && grep -Eq '^[[:space:]]*user_allow_other[[:space:]]*$' "$fuse_conf"; then
	say "$fuse_conf already has user_allow_other"
elif [[ -f $fuse_conf ]] && grep -Eq '^[[:space:]]*#[[:space:]]*user_allow_other[[:space:]]*$' "$fuse_conf"; then
	sed -i -E 's/^[[:space:]]*#[[:space:]]*user_allow_other[[:space:]]*$/user_allow_other/' "$fuse_conf"
	say "enabled user_allow_other in $fuse_conf"
else
	printf 'user_allow_other\n' >>"$fuse_conf"
	say "added user_allow_other to $fuse_conf"
fi

for tool in fusermount3 mount.fuse3; do
	if ! command -v "$tool" >/dev/null 2>&1 && [[ ! -x /sbin/$tool && ! -x /usr/sbin/$tool ]]; then
		say "warning: $tool not found after installing fuse3" >&2
	fi
done
if [[ ! -e /dev/fuse ]]; then
	say "warning: /dev/fuse is missing: load the fuse module (modprobe fuse) or give the container the device" >&2
fi

# Unprivileged mounts go through the setuid fusermount3, which opens
# /dev/fuse with the caller's rights: the device must be world-usable, as
# Debian's udev rule makes it (0666). Some containers ship it 0600.
if [[ -c /dev/fuse ]]; then
	if [[ $(stat -c %a /dev/fuse) != 666 ]]; then
		chmod 0666 /dev/fuse
		say "made /dev/fuse 0666 (unprivileged mounts through fusermount3)"
	fi
else
	say "warning: /dev/fuse is missing; load the fuse module (modprobe fuse)" >&2
fi
# Tests look at the FUSE connections (to abort a hung one): mount fusectl.
if [[ -d /sys/fs/fuse/connections ]] && ! grep -q ' /sys/fs/fuse/connections ' /proc/mounts; then
	mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null && say "mounted fusectl" || true
fi
