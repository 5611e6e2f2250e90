package tests

import (
	"testing"
)

// TestDifferentialStacked: a first sandbox's random history, then its
// upper as the top lower layer of a second sandbox (lowerdir=UPPER:ORIG,
// the stack the README offers), whose own random history goes on from the
// plain directory where the first left it. The second mount must show
// what the plain directory holds throughout: the first's renamed
// directories (redirects of a lower layer), whiteouts and opaque
// directories, beneath the second's copy-ups, renames and removals. The
// hard links the first made are links of the stack's lower layer, parted
// by a copy-up as any original's (linkModel). Neither layer changes.
func TestDifferentialStacked(t *testing.T) {
	seed := diffSeed(t)
	first := newDiffRunGuard(t, seed, true, false, *flagDiffOpSet)
	// A short first history leaves most of the original's directories
	// in place, many of them renamed: redirects of the lower layer.
	n1 := 50 + first.rng.Intn(max(1, *flagDiffOps/6))
	first.run(n1)
	first.compareTrees("end of the first sandbox")
	first.closeFds()
	if err := first.sb.stop(); err != nil {
		t.Fatalf("unmount the first sandbox: %v", err)
	}
	originalGuard(t, first.sb.upper)

	sb := mountSandbox(t, first.sb.upper, withLowers(first.sb.orig))
	r := &diffRun{t: t, seed: seed, rng: first.rng, ref: first.ref, sb: sb, groupIno: map[uint64]bool{}, ops: first.ops}
	if *flagDiffRef == "overlay" {
		// Kernel overlayfs stacked as the sandbox is: it parts the
		// links itself.
		r.ref = restackOverlay(t, first.ref)
	} else {
		r.links = newLinkModel(t, first.ref)
	}
	r.initFds()
	r.compareTrees("start of the second sandbox")
	r.run(*flagDiffOps - n1)
	r.compareTrees("end")
}
