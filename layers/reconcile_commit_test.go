package layers_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// TestLostRemovalOfAChangedOriginalIsRefused: a lost unlink of an original
// file the original changed since (found by a review on 2026-11-28). The
// reconciled removal had no base (the original's ctime is after the
// whiteout's birth), and a removal without a base is never a conflict:
// the commit deleted the original's new content. Its base now matches
// nothing, and the commit refuses.
func TestLostRemovalOfAChangedOriginalIsRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	for _, d := range []string{cfg.Upper, cfg.Work, cfg.Lowers[0]} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	g := filepath.Join(cfg.Lowers[0], "g")
	require.NoError(t, os.WriteFile(g, []byte("old"), 0o644))
	l, err := layers.Open(cfg)
	require.NoError(t, err)
	jp := filepath.Join(cfg.Work, "journal")
	header, err := os.Stat(jp)
	require.NoError(t, err)
	root, err := l.Root()
	require.NoError(t, err)
	require.NoError(t, l.Unlink("", root.Obj, "g", layers.Caller{Pid: 1}))
	// The power cut: the whiteout is on disk, the records are not.
	require.NoError(t, l.Journal().Close())
	require.NoError(t, os.Truncate(jp, header.Size())) // without the cut, Prepare refuses: "content changed in the original"
	require.NoError(t, os.WriteFile(jp+".server", []byte("v1 the-boot-before 1 1\n"), 0o600))
	// Another writer changes the original since.
	require.NoError(t, os.WriteFile(g, []byte("someone else's work"), 0o644))

	x, err := commit.Prepare(cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	_, statErr := os.Stat(g)
	require.Error(t, err, "the commit must refuse: the sandbox never saw this content of g")
	require.NoError(t, statErr, "g was deleted, with someone else's work")
}

// TestLostRemovalOfADirectoryHoldingAMovedOne (found by a review on
// 2026-11-28): mv --exchange c a/c2 (kept), rm -r a (lost). The
// reconciled rmdir of a based the original's a and its entries, not c's,
// which the replay has beneath a too: the commit refused a sandbox whose
// original nobody changed ("c/w: not in the sandbox's view").
func TestLostRemovalOfADirectoryHoldingAMovedOne(t *testing.T) {
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	for _, d := range []string{cfg.Upper, cfg.Work, filepath.Join(cfg.Lowers[0], "a", "c2"), filepath.Join(cfg.Lowers[0], "c")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(cfg.Lowers[0], "c", "w"), []byte("w"), 0o644))
	l, err := layers.Open(cfg)
	require.NoError(t, err)
	c := layers.Caller{Pid: 1}
	look := func(names ...string) layers.Entry {
		e, err := l.Root()
		require.NoError(t, err)
		d := ""
		for _, n := range names {
			e, err = l.Lookup(d, e.Obj, n)
			require.NoError(t, err)
			d = layers.Join(d, n)
		}
		return e
	}
	src := look("c").Obj
	require.NoError(t, l.Rename("", look().Obj, "c", &src, "a", look("a").Obj, "c2", unix.RENAME_EXCHANGE, c))
	jp := filepath.Join(cfg.Work, "journal")
	require.NoError(t, l.Journal().Sync())
	kept, err := os.Stat(jp)
	require.NoError(t, err)
	// rm -r a: its records lost
	require.NoError(t, l.Unlink("a/c2", look("a", "c2").Obj, "w", c))
	require.NoError(t, l.Rmdir("a", look("a").Obj, "c2", c))
	require.NoError(t, l.Rmdir("", look().Obj, "a", c))
	require.NoError(t, l.Journal().Close())
	require.NoError(t, os.Truncate(jp, kept.Size()))
	require.NoError(t, os.WriteFile(jp+".server", []byte("v1 the-boot-before 1 1\n"), 0o600))

	x, err := commit.Prepare(cfg, commit.Options{})
	require.NoError(t, err, "nothing changed in the original: the commit must go through")
	require.NoError(t, commit.Commit(x))
}
