#!/usr/bin/env bash
# Runs sbxfs on a sample: makes a small original directory, mounts a sandbox
# over it, changes things inside the sandbox, shows the recorded change set
# and that the original did not change, then unmounts. Needs root or a user
# who may mount FUSE (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
work=$(mktemp -d /tmp/sbxfs-demo.XXXXXX)
bin=$work/sbxfs
scripts/build.sh "$bin"

orig=$work/original mnt=$work/mnt sandbox=$work/sandbox
mkdir -p "$orig/src" "$orig/docs" "$mnt"
printf 'package main\n\nfunc main() {}\n' >"$orig/src/main.go"
printf '# sample\n' >"$orig/README.md"
printf 'old notes\n' >"$orig/docs/notes.txt"
cleanup() { "$bin" unmount "$mnt" 2>/dev/null || true; }
trap cleanup EXIT

echo "== mount a sandbox over $orig"
"$bin" mount --upper "$sandbox" "$orig" "$mnt"
echo "== change things inside the sandbox"
printf '// edited in the sandbox\n' >>"$mnt/src/main.go"
printf 'new file\n' >"$mnt/src/util.go"
rm "$mnt/docs/notes.txt"
mv "$mnt/docs" "$mnt/documentation"
chmod 600 "$mnt/README.md"
echo "== sbxfs status"
"$bin" status "$mnt"
echo "== the original is untouched"
ls -lR "$orig" | sed 's/^/   /'
echo "== the sandbox shows the changes"
ls -lR "$mnt" | sed 's/^/   /'
echo "== unmount; the changes stay in $sandbox and survive a remount"
"$bin" unmount "$mnt"
"$bin" mount --upper "$sandbox" "$orig" "$mnt"
cat "$mnt/src/util.go"
"$bin" status --json "$mnt" | head -20
"$bin" unmount "$mnt"
trap - EXIT
rm -rf "$work"
echo "demo done"
