package layers_test

import (
	"encoding/binary"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

var flagE2EDead = flag.Bool("reconcile.nomark", false, "TestReconcileAnyCutCommits: the whole journal without a mark (a check of the harness)")

func recordEnds(t *testing.T, path string) []int64 {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	ends := []int64{16}
	for off := 16; off+8 <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		if off+8+n > len(b) {
			break
		}
		off += 8 + n
		ends = append(ends, int64(off))
	}
	return ends
}

func treeOf(t *testing.T, root string) map[string]string {
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(p, &st))
		v := fmt.Sprintf("%s %o", layers.TypeName(st.Mode), st.Mode&0o7777)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			v += " " + string(b)
		case unix.S_IFLNK:
			tg, _ := os.Readlink(p)
			v += " " + tg
		}
		out[rel] = v
		return nil
	}))
	return out
}

// run builds the seed's history in a fresh sandbox, cuts the journal
// after k records (k < 0: keep all), marks the server dead (unless
// nomark) and commits. It returns the view before, the original after,
// and the commit error.
func e2eRun(t *testing.T, seed int64, k int, nomark bool) (want, got map[string]string, hist []string, n int, cerr error) {
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	for _, d := range []string{cfg.Upper, cfg.Work, cfg.Lowers[0]} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	l, hist := layers.RandomHistory(t, cfg, seed, *layers.FlagReconcileOps)
	want = layers.MergedView(t, l)
	require.NoError(t, l.Journal().Close())
	jp := filepath.Join(cfg.Work, "journal")
	ends := recordEnds(t, jp)
	n = len(ends) - 1
	if k >= 0 && k < len(ends) {
		require.NoError(t, os.Truncate(jp, ends[k]))
	}
	if nomark {
		require.NoError(t, os.Remove(jp+".server"))
	} else {
		require.NoError(t, os.WriteFile(jp+".server", []byte("v1 the-boot-before 1234 5678\n"), 0o600))
	}
	x, err := commit.Prepare(cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	return want, treeOf(t, cfg.Lowers[0]), hist, n, err
}

func diffMaps(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			out = append(out, fmt.Sprintf("missing %s (%s)", k, v))
		} else if w != v {
			out = append(out, fmt.Sprintf("differs %s: want %q got %q", k, v, w))
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("extra %s (%s)", k, v))
		}
	}
	return out
}

// TestReconcileAnyCutCommits (written by a review on 2026-11-28): each
// random history's journal cut after every record in turn, the server's
// mark a dead one's, and the sandbox committed: the original must end
// as the merged view was, or the commit refuse (a conflict, the
// original unchanged). No run may commit another tree.
func TestReconcileAnyCutCommits(t *testing.T) {
	seeds := []int64{}
	if *layers.FlagReconcileSeed != 0 {
		seeds = append(seeds, *layers.FlagReconcileSeed)
	} else {
		for i := 1; i <= *layers.FlagReconcileSeeds; i++ {
			seeds = append(seeds, int64(i))
		}
	}
	refused, wrong := 0, 0
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			// harness: whole journal, clean stop
			want, got, hist, n, err := e2eRun(t, seed, -1, true)
			if err != nil || len(diffMaps(want, got)) > 0 {
				t.Errorf("the whole journal, stopped cleanly, commits another tree or none: %v %q\n hist %q", err, diffMaps(want, got), hist)
				return
			}
			for k := n; k >= 0; k-- {
				want, got, hist, _, err := e2eRun(t, seed, k, *flagE2EDead)
				if err != nil {
					refused++
					t.Logf("cut %d/%d refused: %v\n hist %q", k, n, err, hist)
					continue
				}
				if d := diffMaps(want, got); len(d) > 0 {
					wrong++
					t.Errorf("cut %d/%d WRONG TREE: %q\n hist %q", k, n, d, hist)
					break
				}
			}
		})
	}
	t.Logf("refused %d wrong %d", refused, wrong)
}
