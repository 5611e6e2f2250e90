package layers_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// powerCutStack is a sandbox's configuration, its original and journal,
// for the tests of the walk after a power cut below.
type powerCutStack struct {
	cfg   layers.Config
	lower string
	jp    string
}

func newPowerCutStack(t *testing.T, dirs []string, files map[string]string) powerCutStack {
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	for _, d := range append([]string{cfg.Upper, cfg.Work, cfg.Lowers[0]}, dirs...) {
		if !filepath.IsAbs(d) {
			d = filepath.Join(cfg.Lowers[0], d)
		}
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	for f, c := range files {
		require.NoError(t, os.WriteFile(filepath.Join(cfg.Lowers[0], f), []byte(c), 0o644))
	}
	return powerCutStack{cfg: cfg, lower: cfg.Lowers[0], jp: filepath.Join(cfg.Work, "journal")}
}

// lookPath looks names up from the root.
func lookPath(t *testing.T, l *layers.Layers, names ...string) layers.Entry {
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

// powerCut closes l's journal, cuts it back to size and leaves a mark of
// another boot, as a power cut would.
func powerCut(t *testing.T, l *layers.Layers, jp string, size int64) {
	require.NoError(t, l.Journal().Close())
	require.NoError(t, os.Truncate(jp, size))
	require.NoError(t, os.WriteFile(jp+".server", []byte("v1 the-boot-before 1 1\n"), 0o600))
}

// TestPoisonedDirBaseTakesLaterDirChanges (found by a review on
// 2026-11-28): the sandbox writes d/x; the power cut loses the records
// (d's copy-up and its base among them); another writer then adds d/new
// to the original (d's ctime moves past the upper copy's birth). The next
// mount reconciles: d gets a base that matches nothing, written for good.
// Then the sandbox, mounted again, makes a change of d that is recorded:
// chmod, rename, or rm -r. Nobody changed d's mode: the commit goes
// through (with d's base mode flipped, it refused each: "mode changed in
// the original").
func TestPoisonedDirBaseTakesLaterDirChanges(t *testing.T) {
	for _, c := range []struct {
		name  string
		act   func(t *testing.T, l *layers.Layers)
		check func(t *testing.T, lower string)
	}{
		{"chmod d", func(t *testing.T, l *layers.Layers) {
			d := lookPath(t, l, "d")
			m := uint32(0o700)
			_, err := l.Setattr("d", &d.Obj, -1, layers.SetAttr{Mode: &m}, layers.Caller{Pid: 1})
			require.NoError(t, err)
		}, func(t *testing.T, lower string) {
			st, err := os.Stat(filepath.Join(lower, "d"))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
		}},
		{"mv d e", func(t *testing.T, l *layers.Layers) {
			d := lookPath(t, l, "d")
			require.NoError(t, l.Rename("", lookPath(t, l).Obj, "d", &d.Obj, "", lookPath(t, l).Obj, "e", 0, layers.Caller{Pid: 1}))
		}, func(t *testing.T, lower string) {
			got, err := os.ReadFile(filepath.Join(lower, "e", "new"))
			require.NoError(t, err)
			require.Equal(t, "someone else's file", string(got))
		}},
		{"rm -r d", func(t *testing.T, l *layers.Layers) {
			c := layers.Caller{Pid: 1}
			require.NoError(t, l.Unlink("d", lookPath(t, l, "d").Obj, "x", c))
			require.NoError(t, l.Unlink("d", lookPath(t, l, "d").Obj, "new", c))
			require.NoError(t, l.Rmdir("", lookPath(t, l).Obj, "d", c))
		}, func(t *testing.T, lower string) {
			_, err := os.Lstat(filepath.Join(lower, "d"))
			require.True(t, os.IsNotExist(err))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newPowerCutStack(t, []string{"d"}, map[string]string{"d/x": "original"})
			l, err := layers.Open(s.cfg)
			require.NoError(t, err)
			require.NoError(t, l.Journal().Sync())
			kept, err := os.Stat(s.jp)
			require.NoError(t, err)
			// The sandbox writes d/x: its records are lost.
			x := lookPath(t, l, "d", "x")
			fd, _, err := l.Open("d/x", &x.Obj, unix.O_WRONLY|unix.O_TRUNC, layers.Caller{Pid: 1})
			require.NoError(t, err)
			_, err = unix.Write(fd, []byte("sandbox"))
			require.NoError(t, err)
			unix.Close(fd)
			powerCut(t, l, s.jp, kept.Size())
			// Another writer adds a file in d (its mode stays 0755).
			require.NoError(t, os.WriteFile(filepath.Join(s.lower, "d", "new"), []byte("someone else's file"), 0o644))

			// Mounted again: reconciled, then the sandbox changes d.
			l, err = layers.Open(s.cfg)
			require.NoError(t, err)
			require.NotZero(t, l.Reconciled())
			c.act(t, l)
			require.NoError(t, l.Close())

			x2, err := commit.Prepare(s.cfg, commit.Options{})
			if err == nil {
				err = commit.Commit(x2)
			}
			require.NoError(t, err, "nobody but the sandbox changed d's mode; the other writer's file is in the sandbox's view")
			c.check(t, s.lower)
		})
	}
}

// TestLostRootBase (found by a review on 2026-11-28): the root's base is
// lost with the tail (the sandbox's first records); another writer then
// chmods the original's root. The walk named the root (its attributes
// differ from the original's now) without a base, and a root without a
// base is never a conflict: the commit put the old mode back over the
// other writer's chmod.
func TestLostRootBase(t *testing.T) {
	s := newPowerCutStack(t, nil, map[string]string{"f": "original"})
	j, err := layers.OpenJournal(s.jp)
	require.NoError(t, err)
	require.NoError(t, j.Close())
	bare, err := os.Stat(s.jp)
	require.NoError(t, err)
	l, err := layers.Open(s.cfg) // records the root's base (adoptRoot)
	require.NoError(t, err)
	f := lookPath(t, l, "f")
	fd, _, err := l.Open("f", &f.Obj, unix.O_WRONLY|unix.O_TRUNC, layers.Caller{Pid: 1})
	require.NoError(t, err)
	_, err = unix.Write(fd, []byte("sandbox"))
	require.NoError(t, err)
	unix.Close(fd)
	powerCut(t, l, s.jp, bare.Size())
	require.NoError(t, os.Chmod(s.lower, 0o700)) // another writer

	x, err := commit.Prepare(s.cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	st, serr := os.Stat(s.lower)
	require.NoError(t, serr)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the original root's mode after the commit (%v)", err)
	require.Error(t, err, "the commit must refuse: the sandbox's copy of the root has another mode than the original's, and nothing tells who changed it")
}

// TestLostRemovalOfADirectoryWhoseEntriesCameAndWent (found by a review
// on 2026-11-28): rm -r a (a/b/f, a/g) lost with the tail; another writer
// then makes and removes a scratch file in a/b (an editor's swap file):
// a/b holds what the sandbox saw, only its ctime moved. The commit
// removing a drops nothing of anyone's (with a/b's base mode flipped it
// refused: "mode changed in the original").
func TestLostRemovalOfADirectoryWhoseEntriesCameAndWent(t *testing.T) {
	s := newPowerCutStack(t, []string{"a/b"}, map[string]string{"a/b/f": "f", "a/g": "g"})
	l, err := layers.Open(s.cfg)
	require.NoError(t, err)
	require.NoError(t, l.Journal().Sync())
	kept, err := os.Stat(s.jp)
	require.NoError(t, err)
	c := layers.Caller{Pid: 1}
	require.NoError(t, l.Unlink("a/b", lookPath(t, l, "a", "b").Obj, "f", c))
	require.NoError(t, l.Rmdir("a", lookPath(t, l, "a").Obj, "b", c))
	require.NoError(t, l.Unlink("a", lookPath(t, l, "a").Obj, "g", c))
	require.NoError(t, l.Rmdir("", lookPath(t, l).Obj, "a", c))
	powerCut(t, l, s.jp, kept.Size())
	tmp := filepath.Join(s.lower, "a", "b", ".swp")
	require.NoError(t, os.WriteFile(tmp, nil, 0o644))
	require.NoError(t, os.Remove(tmp))

	x, err := commit.Prepare(s.cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	require.NoError(t, err, "a/b holds what the sandbox saw")
	_, err = os.Lstat(filepath.Join(s.lower, "a"))
	require.True(t, os.IsNotExist(err))
}

// TestLostCreateInADirectoryTheOriginalReplaced (found by a review on
// 2026-11-28): the sandbox makes d/n (its records lost with d's copy-up);
// another writer then replaces d with a new directory. With the whole
// journal the commit refuses ("d: replaced in the original", unless the
// new directory took the old one's inode number); after the walk, d's base took
// the new directory's inode, and the check of a change's parent
// directories, which compares the inode alone, let n into the other
// writer's directory. The new directory was made after the sandbox's
// copy of d (its birth time): its base names no inode now.
func TestLostCreateInADirectoryTheOriginalReplaced(t *testing.T) {
	s := newPowerCutStack(t, []string{"d"}, map[string]string{"d/x": "x"})
	l, err := layers.Open(s.cfg)
	require.NoError(t, err)
	require.NoError(t, l.Journal().Sync())
	kept, err := os.Stat(s.jp)
	require.NoError(t, err)
	fd, _, err := l.Create("d", lookPath(t, l, "d").Obj, "n", 0o644, layers.Caller{Pid: 1})
	require.NoError(t, err)
	unix.Close(fd)
	powerCut(t, l, s.jp, kept.Size())
	require.NoError(t, os.RemoveAll(filepath.Join(s.lower, "d")))
	require.NoError(t, os.Mkdir(filepath.Join(s.lower, "d"), 0o755))
	x, err := commit.Prepare(s.cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	require.Error(t, err, "d was replaced in the original")
	_, err = os.Lstat(filepath.Join(s.lower, "d", "n"))
	require.True(t, os.IsNotExist(err), "nothing of the sandbox's in the other writer's directory: %v", err)
}

// TestLostRemovalOfADirectoryAnotherWriterMovedInto (found by a random
// test of power cuts with another writer, 2026-11-28): rmdir e (empty)
// lost with the tail; another writer then moves a (holding a/x) into e.
// The walk based e's entries on the original as it is now, e/b among
// them, and the commit removed e with the other writer's a/x in it. An
// entry of a directory changed since that was itself changed since (a
// rename sets its ctime) gets no base now: the commit refuses.
func TestLostRemovalOfADirectoryAnotherWriterMovedInto(t *testing.T) {
	s := newPowerCutStack(t, []string{"e", "a"}, map[string]string{"a/x": "x"})
	l, err := layers.Open(s.cfg)
	require.NoError(t, err)
	require.NoError(t, l.Journal().Sync())
	kept, err := os.Stat(s.jp)
	require.NoError(t, err)
	require.NoError(t, l.Rmdir("", lookPath(t, l).Obj, "e", layers.Caller{Pid: 1}))
	powerCut(t, l, s.jp, kept.Size())
	time.Sleep(20 * time.Millisecond) // past the clock's tick
	require.NoError(t, os.Rename(filepath.Join(s.lower, "a"), filepath.Join(s.lower, "e", "b")))

	x, err := commit.Prepare(s.cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	got, rerr := os.ReadFile(filepath.Join(s.lower, "e", "b", "x"))
	require.NoError(t, rerr, "the other writer's file after the commit (%v)", err)
	require.Equal(t, "x", string(got))
	require.Error(t, err, "the commit must refuse: e holds what the sandbox never saw")
}
