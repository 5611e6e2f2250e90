package layers_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

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
