package layers_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	look := func(names ...string) layers.Entry { return lookPath(t, l, names...) }
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

// TestCrashWithAWholeJournalWhileTheOriginalChanges: the server's process
// was killed (its journal is whole: every record it wrote is in the page
// cache, each before its operation) after the sandbox wrote files in
// directories of the original, which another writer then changed. The
// mark says a crash, not a loss: no walk of the upper adds records (the
// walk, which cannot tell a lost change of the sandbox's from one the
// original made since, took the original's chmod of d for the sandbox's
// and refused the commit over it; and took the upper's copy of a
// directory the original replaced with a file for one the sandbox made).
// The commit is the one a clean stop gives: through over the chmod,
// refused over the replacement and the removal.
func TestCrashWithAWholeJournalWhileTheOriginalChanges(t *testing.T) {
	for _, c := range []struct {
		name     string
		powerCut bool // the journal lost every record, the mark names another boot
		change   func(t *testing.T, lower string)
		check    func(t *testing.T, lower string, err error)
	}{
		{"chmod", false, func(t *testing.T, lower string) {
			require.NoError(t, os.Chmod(filepath.Join(lower, "d"), 0o700))
		}, func(t *testing.T, lower string, err error) {
			require.NoError(t, err, "the commit of a sandbox that never changed d's mode")
			st, serr := os.Stat(filepath.Join(lower, "d"))
			require.NoError(t, serr)
			require.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the original's chmod stays")
			got, rerr := os.ReadFile(filepath.Join(lower, "d", "x"))
			require.NoError(t, rerr)
			require.Equal(t, "sandbox", string(got))
		}},
		{"replaced and removed", false, func(t *testing.T, lower string) {
			require.NoError(t, os.RemoveAll(filepath.Join(lower, "d")))
			require.NoError(t, os.WriteFile(filepath.Join(lower, "d"), []byte("someone else's file"), 0o644))
			require.NoError(t, os.RemoveAll(filepath.Join(lower, "e")))
		}, func(t *testing.T, lower string, err error) {
			require.Error(t, err, "the commit must refuse: the original replaced d and removed e")
			got, rerr := os.ReadFile(filepath.Join(lower, "d"))
			require.NoError(t, rerr)
			require.Equal(t, "someone else's file", string(got))
			_, serr := os.Lstat(filepath.Join(lower, "e"))
			require.True(t, os.IsNotExist(serr), "e stays removed: %v", serr)
		}},
		// After a power cut the walk runs: a directory the sandbox only
		// wrote in, whose mode and owner are the original's, is not
		// named, so a file the original added there since (which moves
		// the directory's ctime past the upper copy's birth, and so
		// would poison its base) is no conflict.
		{"power cut, a file added", true, func(t *testing.T, lower string) {
			require.NoError(t, os.WriteFile(filepath.Join(lower, "d", "new"), []byte("someone else's file"), 0o644))
		}, func(t *testing.T, lower string, err error) {
			require.NoError(t, err, "the commit")
			for f, want := range map[string]string{"d/x": "sandbox", "e/y": "sandbox", "d/new": "someone else's file"} {
				got, rerr := os.ReadFile(filepath.Join(lower, f))
				require.NoError(t, rerr)
				require.Equal(t, want, string(got), f)
			}
		}},
		// Not so a directory whose mode differs: the sandbox's chmod
		// lost, or the original's since, nothing tells which.
		{"power cut, chmod", true, func(t *testing.T, lower string) {
			require.NoError(t, os.Chmod(filepath.Join(lower, "d"), 0o700))
		}, func(t *testing.T, lower string, err error) {
			require.Error(t, err, "the commit must refuse")
			st, serr := os.Stat(filepath.Join(lower, "d"))
			require.NoError(t, serr)
			require.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the original's chmod stays")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
			lower := cfg.Lowers[0]
			for _, d := range []string{cfg.Upper, cfg.Work, filepath.Join(lower, "d"), filepath.Join(lower, "e")} {
				require.NoError(t, os.MkdirAll(d, 0o755))
			}
			for _, f := range []string{"d/x", "e/y"} {
				require.NoError(t, os.WriteFile(filepath.Join(lower, f), []byte("original"), 0o644))
			}
			l, err := layers.Open(cfg)
			require.NoError(t, err)
			jp := filepath.Join(cfg.Work, "journal")
			header, err := os.Stat(jp)
			require.NoError(t, err)
			caller := layers.Caller{Pid: 1}
			for _, f := range []string{"d/x", "e/y"} {
				dn, name := filepath.Split(f)
				fe := lookPath(t, l, filepath.Clean(dn), name)
				fd, _, err := l.Open(f, &fe.Obj, unix.O_WRONLY|unix.O_TRUNC, caller)
				require.NoError(t, err)
				_, err = unix.Write(fd, []byte("sandbox"))
				unix.Close(fd)
				require.NoError(t, err)
			}
			// The kill: the journal is whole, the mark stays, naming a
			// process that is gone (pid 1 started at another time).
			require.NoError(t, l.Journal().Close())
			mark, err := os.ReadFile(jp + ".server")
			require.NoError(t, err)
			f := strings.Fields(string(mark))
			require.Len(t, f, 5)
			f[2], f[3] = "1", "1"
			if c.powerCut {
				f[1] = "the-boot-before"
				require.NoError(t, os.Truncate(jp, header.Size()))
			}
			require.NoError(t, os.WriteFile(jp+".server", []byte(strings.Join(f, " ")+"\n"), 0o600))
			whole, err := layers.ReadJournal(jp)
			require.NoError(t, err)

			c.change(t, lower)
			recs, err := layers.Records(cfg)
			require.NoError(t, err)
			if !c.powerCut {
				require.Len(t, recs, len(whole), "a crash adds no records")
			}
			x, err := commit.Prepare(cfg, commit.Options{})
			if err == nil {
				err = commit.Commit(x)
			}
			c.check(t, lower, err)
		})
	}
}

// TestLostRenameOverAnOriginalChangedSince: mv a b, then another writer
// changes the original's b, then chmod b in the sandbox; a power cut
// loses the records. The original's b was replaced by the rename, before
// its change: the commit must refuse, as with the whole journal (the
// rename's record based b as it was). The reconciled base of b took its
// time from the moved object's ctime, which the later chmod moved past
// the other writer's change: the commit replaced b and lost that work.
func TestLostRenameOverAnOriginalChangedSince(t *testing.T) {
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	lower := cfg.Lowers[0]
	for _, d := range []string{cfg.Upper, cfg.Work, lower} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	for _, f := range []string{"a", "b"} {
		require.NoError(t, os.WriteFile(filepath.Join(lower, f), []byte(f), 0o644))
	}
	l, err := layers.Open(cfg)
	require.NoError(t, err)
	jp := filepath.Join(cfg.Work, "journal")
	header, err := os.Stat(jp)
	require.NoError(t, err)
	c := layers.Caller{Pid: 1}
	root, err := l.Root()
	require.NoError(t, err)
	a, err := l.Lookup("", root.Obj, "a")
	require.NoError(t, err)
	require.NoError(t, l.Rename("", root.Obj, "a", &a.Obj, "", root.Obj, "b", 0, c))
	time.Sleep(20 * time.Millisecond) // past the clock's tick
	require.NoError(t, os.WriteFile(filepath.Join(lower, "b"), []byte("someone else's work"), 0o644))
	time.Sleep(20 * time.Millisecond)
	b, err := l.Lookup("", root.Obj, "b")
	require.NoError(t, err)
	mode := uint32(0o600)
	_, err = l.Setattr("b", &b.Obj, -1, layers.SetAttr{Mode: &mode}, c)
	require.NoError(t, err)
	// The power cut: every record lost, the upper kept.
	require.NoError(t, l.Journal().Close())
	require.NoError(t, os.Truncate(jp, header.Size()))
	require.NoError(t, os.WriteFile(jp+".server", []byte("v1 the-boot-before 1 1\n"), 0o600))

	x, err := commit.Prepare(cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	got, rerr := os.ReadFile(filepath.Join(lower, "b"))
	require.NoError(t, rerr)
	require.Equal(t, "someone else's work", string(got), "the original's b after the commit (%v)", err)
	require.Error(t, err, "the commit must refuse: the original changed b after the rename replaced it")
}
