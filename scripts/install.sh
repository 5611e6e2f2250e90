#!/usr/bin/env bash
# Installs sbxfs: its dependencies (scripts/install-deps.sh), the binary
# (PREFIX/bin/sbxfs, PREFIX=/usr/local by default), and the mount helper
# links /sbin/mount.fuse.sbxfs and /usr/sbin/mount.fuse.sbxfs, so that
#
#   mount -t fuse.sbxfs sbxfs MNT -o lowerdir=L,upperdir=U,workdir=W
#
# and /etc/fstab lines of type fuse.sbxfs work.
#
# Usage: scripts/install.sh [PREFIX]
# Environment: PREFIX (install prefix), SBIN_DIRS (where the mount helper
# links go, default "/sbin /usr/sbin"), SKIP_DEPS=1 (do not run
# install-deps.sh), GO (the go command, for scripts/build.sh).
set -euo pipefail

say() { printf 'install: %s\n' "$*"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${1:-${PREFIX:-/usr/local}}
sbin_dirs=${SBIN_DIRS:-/sbin /usr/sbin}
bindir=$prefix/bin
bin=$bindir/sbxfs

if [[ ${SKIP_DEPS:-0} != 1 ]]; then
	"$repo/scripts/install-deps.sh"
fi

version=dev
if command -v git >/dev/null 2>&1 && git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
	version=$(git -C "$repo" describe --always --dirty 2>/dev/null || echo dev)
fi

mkdir -p "$bindir"
# Build next to the target and rename: a running sbxfs keeps its binary.
tmp=$(mktemp "$bindir/.sbxfs.XXXXXX")
trap 'rm -f "$tmp"' EXIT
"$repo/scripts/build.sh" "$tmp" "$version"
chmod 0755 "$tmp"
mv -f "$tmp" "$bin"
trap - EXIT
say "built $bin ($version)"

for d in $sbin_dirs; do
	link=$d/mount.fuse.sbxfs
	if [[ $(readlink "$link" 2>/dev/null || true) == "$bin" ]]; then
		say "$link already links to $bin"
		continue
	fi
	mkdir -p "$d"
	ln -sfn "$bin" "$link"
	say "linked $link -> $bin"
done

"$bin" --version
