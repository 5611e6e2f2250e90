#!/usr/bin/env bash
# Makes (or removes) the scratch filesystem the benchmarks run on: an ext4
# with a journal on a loop device, as users' disks have (the root
# filesystem of the build machines has no journal, which makes file
# creation after large deletes slow and would distort the numbers).
#   scripts/bench-disk.sh up [SIZE]   -> prints the mountpoint
#   scripts/bench-disk.sh down
set -euo pipefail
img=${SBXFS_BENCH_IMG:-/var/tmp/sbxfs-bench.img}
mnt=${SBXFS_BENCH_MNT:-/mnt/sbxfs-bench}
case "${1:-up}" in
up)
	size=${2:-8G}
	if ! mountpoint -q "$mnt"; then
		mkdir -p "$mnt"
		rm -f "$img"
		truncate -s "$size" "$img"
		mkfs.ext4 -q -F -O has_journal "$img"
		mount -o loop "$img" "$mnt"
	fi
	echo "$mnt"
	;;
down)
	if mountpoint -q "$mnt"; then umount "$mnt"; fi
	rm -f "$img"
	;;
*)
	echo "usage: $0 up [SIZE] | down" >&2
	exit 2
	;;
esac
