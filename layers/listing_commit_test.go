package layers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// TestListingHistoriesCommit: the random histories of
// TestListingMatchesTheTrees, committed: the original must end as the
// sandbox's view was (type, permission bits, content, target). A wrong
// listing misleads a user; a wrong commit loses work. A fifth of
// -listing.seeds, from -listing.first (or -listing.seed alone, with the
// history of -listing.minimize's file if given).
func TestListingHistoriesCommit(t *testing.T) {
	first, n := *layers.FlagListingFirst, int64(max(1, *layers.FlagListingSeeds/5))
	if *layers.FlagListingSeed != 0 {
		first, n = *layers.FlagListingSeed, 1
	}
	var replay []string
	if *layers.FlagListingReplay != "" {
		b, err := os.ReadFile(*layers.FlagListingReplay)
		require.NoError(t, err)
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				replay = append(replay, l)
			}
		}
	}
	var failed []int64
	for seed := first; seed < first+n; seed++ {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(seed))
		cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
		l, hist, _, ok := layers.ListingHistory(t, cfg, seed, replay)
		want := layers.MergedView(t, l)
		require.NoError(t, l.Close())
		if !ok {
			t.Fatalf("seed %d: the replay asked what the kernel refuses", seed)
		}
		x, err := commit.Prepare(cfg, commit.Options{})
		if err == nil {
			err = commit.Commit(x)
		}
		if d := diffMaps(want, treeOf(t, cfg.Lowers[0])); err != nil || len(d) > 0 {
			failed = append(failed, seed)
			if len(failed) <= 3 {
				t.Errorf("seed %d: the commit %v, the original differs from the view: %q\nhistory:\n  %s", seed, err, d, strings.Join(hist, "\n  "))
			}
		}
		os.RemoveAll(dir)
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d seeds failed: %v", len(failed), n, failed)
	}
}
