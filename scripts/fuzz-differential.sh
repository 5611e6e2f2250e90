#!/usr/bin/env bash
# Runs the differential tests again and again with random seeds and
# random options, as root, until N runs are done or STOPFILE appears:
#   scripts/fuzz-differential.sh [-n N] [--uring] [--out DIR]
# Each run is every TestDifferential* test and
# TestHostileSymlinkSwapDuringCommit with a new -seed, always with
# -diff.compact (the journal compacted every 2 KiB), and at random
# -diff.longupper, -diff.churn, -diff.commit (a random history for
# TestDifferentialCommit) and the kernel overlayfs reference (with the
# -diff.avoid list of the places where sbxfs follows ext4 instead:
# docs/commit.md). --uring switches the fuse module's enable_uring on for
# the runs (FUSE over io_uring) and puts it back. Each run's output goes
# to DIR/runK.log (default /tmp/sbxfs-fuzz); a line per run says ok or
# FAIL with the seed and options, which rerun it:
#   go test ./tests -run 'TestDifferential|TestHostileSymlinkSwapDuringCommit' -args -seed S OPTIONS
# touch DIR/stop to end after the run in progress.
# The runs test a copy of the working tree made at the start
# (DIR/src, without what .gitignore leaves out): the tests build the CLI
# and their stand-in servers from the source at every run, and an edit
# made meanwhile would otherwise give some runs a half-edited server.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

n=20 uring=0 out=/tmp/sbxfs-fuzz
while (($#)); do
	case $1 in
	-n) n=$2; shift 2 ;;
	--uring) uring=1; shift ;;
	--out) out=$2; shift 2 ;;
	*) echo "usage: $0 [-n N] [--uring] [--out DIR]" >&2; exit 2 ;;
	esac
done
if [[ $(id -u) -ne 0 ]]; then
	echo "$0: must run as root (it mounts)" >&2
	exit 1
fi

mkdir -p "$out"
rm -f "$out/stop"
src=$out/src
rsync -a --delete --exclude=.git --filter=':- .gitignore' ./ "$src/"
cd "$src"
bin=$out/differential.test
go test -race -c -o "$bin" ./tests

knob=/sys/module/fuse/parameters/enable_uring
if ((uring)); then
	if [[ ! -w $knob ]]; then
		echo "$0: this kernel has no FUSE over io_uring ($knob)" >&2
		exit 1
	fi
	saved=$(cat "$knob")
	trap 'echo "$saved" > "$knob"' EXIT
	echo Y >"$knob"
fi

failed=0
for ((i = 1; i <= n; i++)); do
	[[ -e $out/stop ]] && break
	seed=$((RANDOM * 32768 + RANDOM))
	opts=(-diff.compact)
	((RANDOM % 3 == 0)) && opts+=(-diff.longupper)
	((RANDOM % 3 == 0)) && opts+=(-diff.churn)
	((RANDOM % 2 == 0)) && opts+=(-diff.commit)
	((RANDOM % 4 == 0)) && opts+=(-diff.ref=overlay -diff.avoid=xattrflags,openunlink,fds,noopchown)
	log=$out/run$i.log
	# The test binary runs in tests/, where its helpers expect to be.
	if (cd tests && "$bin" -test.run 'TestDifferential|TestHostileSymlinkSwapDuringCommit' -test.count=1 \
		-seed "$seed" "${opts[@]}") >"$log" 2>&1; then
		echo "run $i ok -seed $seed ${opts[*]}"
	else
		echo "run $i FAIL -seed $seed ${opts[*]} (log: $log)"
		failed=$((failed + 1))
	fi
done
echo "done: $failed failed"
((failed == 0))
