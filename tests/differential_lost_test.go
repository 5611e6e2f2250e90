package tests

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxfs/sbxfs/layers"
)

// TestDifferentialLostJournalTail: a power cut can keep the upper's
// changes and lose the tail of the change journal (the upper's changes
// become durable with any commit of its filesystem's journal, which
// another process's fsync forces; the records with the server's next
// sync). Each run makes a random history through the mount, kills the
// server (its mark beside the journal stays, as a power cut leaves it,
// made to name another boot), cuts the journal at a random record
// boundary, and commits: one run of
// two through a new mount (whose server appends the records that name
// what the upper holds before it serves), the other unmounted (the CLI
// reads those records without writing them). The original must end as
// the plain directory that got the same operations. Until 2026-11-28
// the lost changes were dropped: the commit left the original as the
// journal's prefix described it (layers/reconcile.go).
func TestDifferentialLostJournalTail(t *testing.T) {
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
	type run struct {
		seed    int64
		opset   int
		remount bool
	}
	runs := []run{{1, diffOpSetChurn, true}, {2, diffOpSetChurn, false}, {3, diffOpSetLatest, true}, {4, diffOpSetLatest, false}}
	if *flagSeed != 0 {
		runs = []run{{*flagSeed, *flagDiffOpSet, *flagSeed%2 == 0}}
		if *flagDiffChurn {
			runs[0].opset = diffOpSetChurn
		}
	}
	for _, c := range runs {
		t.Run(fmt.Sprint(c.seed), func(t *testing.T) {
			rerun := fmt.Sprintf("go test ./tests -run 'TestDifferentialLostJournalTail$' -seed %d", c.seed)
			if c.opset == diffOpSetChurn {
				rerun += " -diff.churn"
			}
			t.Logf("seed %d (rerun: %s)", c.seed, rerun)
			diffLostTail(t, c.seed, *flagDiffOps/5, c.opset, c.remount)
		})
	}
}

var flagDiffLostAny = flag.Bool("diff.lostany", false, "TestDifferentialLostJournalTail cuts the journal anywhere, not only in its last 40 records")

func diffLostTail(t *testing.T, seed int64, ops, opset int, remount bool) {
	r := newDiffRunGuard(t, seed, false, true, opset)
	withGit := gitTrack(t, r.sb.orig)
	r.run(ops)
	r.compareTrees("before the power cut")
	r.closeFds()
	r.links.release()
	journal := filepath.Join(r.sb.work, "journal")
	r.sb.kill(t)
	r.sb.forceUnmount()
	ends := journalRecordEnds(t, journal)
	// A power cut loses what was appended since the server's last sync
	// (200 ms of work at most: a few dozen records here), unless
	// -diff.lostany has the cut fall anywhere.
	k := len(ends) - 1 - r.rng.Intn(min(len(ends), 40))
	if *flagDiffLostAny {
		k = r.rng.Intn(len(ends))
	}
	if err := os.Truncate(journal, ends[k]); err != nil {
		t.Fatal(err)
	}
	powerCutMark(t, journal)
	how := "unmounted"
	target := r.sb.state
	if remount {
		r.sb.start(t)
		how, target = "through a new mount", r.sb.mnt
	}
	t.Logf("journal cut after %d of its %d records (%d of %d bytes); committing %s", k, len(ends)-1, ends[k], ends[len(ends)-1], how)
	recs, err := layers.Records(r.sb.layersConfig())
	if err != nil {
		t.Fatalf("the journal's records, reconciled with the upper: %v", err)
	}
	defer func() {
		if t.Failed() {
			var b strings.Builder
			for _, rec := range recs[min(k, len(recs)):] {
				fmt.Fprintf(&b, "\n  %s %q %q %d", rec.Op, rec.Path, rec.Path2, rec.Flags)
			}
			t.Logf("the records added to reconcile the journal with the upper:%s", b.String())
		}
	}()
	r.commitAndCompare(target, withGit)
}

// powerCutMark makes the server mark beside journal name another boot, as
// a power cut leaves it: a killed server's mark on this boot says its
// journal is whole (layers/reconcile.go), which the cut above is not.
func powerCutMark(t *testing.T, journal string) {
	t.Helper()
	b, err := os.ReadFile(journal + ".server")
	if err != nil {
		t.Fatalf("the killed server's mark: %v", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		t.Fatalf("the killed server's mark %q", b)
	}
	f[1] = "the-boot-before"
	if err := os.WriteFile(journal+".server", []byte(strings.Join(f, " ")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// journalRecordEnds returns the offsets at which the journal at path may
// be cut between whole records: after its header, after each record.
func journalRecordEnds(t *testing.T, path string) []int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const header, frame = 16, 8
	if len(b) < header {
		t.Fatalf("journal %s: %d bytes, shorter than its header", path, len(b))
	}
	ends := []int64{header}
	for off := header; off+frame <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		if off+frame+n > len(b) {
			break
		}
		off += frame + n
		ends = append(ends, int64(off))
	}
	return ends
}
