package commit

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// An immutable directory in the original makes the apply fail half-way:
// what was applied is undone, the error says so, and after the cause is
// fixed the same sandbox commits.
func TestFailedApplyIsUndoneAndRetryable(t *testing.T) {
	s := newSandbox(t, map[string]string{"a/f": "a", "z/g": "z"})
	s.write("a/f", "changed")
	s.write("z/new", "new")
	s.done()
	old := snapshot(t, s.orig)
	unlock := immutable(t, filepath.Join(s.orig, "z"))

	err := commitAll(t, s.cfg, Options{})
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, StageApply, ce.Stage)
	assert.True(t, ce.RolledBack, "the error says the original is unchanged")
	assert.ErrorIs(t, err, unix.EPERM)
	assert.Equal(t, old, snapshot(t, s.orig))

	unlock()
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	assert.Equal(t, snapshot(t, s.ref), snapshot(t, s.orig))
}

// An apply that stops before the rename bringing an object to a path is
// undone without touching what is at that path: the undo of the metadata
// step for the object (which never ran) once set that object's old
// metadata on whatever was there. Here the sandbox exchanges a directory
// and a file; the original's file kept the directory's mode after the
// "the original is unchanged" undo.
func TestUndoOfAnApplyStoppedBeforeAnExchange(t *testing.T) {
	s := newSandbox(t, map[string]string{"g/x": "x", "h/f": "f", "a/keep": "k"})
	require.NoError(t, os.Chmod(filepath.Join(s.orig, "g"), 0o750))
	require.NoError(t, os.Chmod(filepath.Join(s.orig, "h", "f"), 0o640))
	src := s.lookup("g")
	require.NoError(t, s.l.Rename("", s.lookup(""), "g", &src, "h", s.lookup("h"), "f", unix.RENAME_EXCHANGE, s.c))
	s.write("a/new", "new")
	s.done()
	old := snapshotTimes(t, s.orig)
	unlock := immutable(t, filepath.Join(s.orig, "a"))

	err := commitAll(t, s.cfg, Options{})
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.True(t, ce.RolledBack, "%v", err)
	unlock()
	assert.Equal(t, old, snapshotTimes(t, s.orig), "the original is unchanged, modes too")
}

// An undo records the state it leaves as the next commit's base (moving
// objects away and back changes their ctime), but only for the objects
// the sandbox saw: an original file replaced while the undo ran (by
// someone else, or swapped for a moment) stays a conflict, so the next
// commit does not overwrite the new file.
func TestUndoDoesNotAdoptAReplacedOriginal(t *testing.T) {
	s := newSandbox(t, map[string]string{"a/f": "a", "b/g": "b", "c/h": "c"})
	s.write("a/f", "changed")
	s.write("b/new", "new")
	s.write("c/h", "changed")
	s.done()
	unlock := immutable(t, filepath.Join(s.orig, "b"))

	h := filepath.Join(s.orig, "c", "h")
	replaced := false
	err := commitAll(t, s.cfg, Options{Fault: func(point string) {
		if point == "undoing" && !replaced {
			replaced = true
			require.NoError(t, os.Remove(h))
			require.NoError(t, os.WriteFile(h, []byte("someone else's\n"), 0o644))
		}
	}})
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.True(t, ce.RolledBack, "%v", err)
	require.True(t, replaced, "the undo ran")

	unlock()
	err = commitAll(t, s.cfg, Options{})
	require.ErrorAs(t, err, &ce)
	require.Len(t, ce.Conflicts, 1, "%v", err)
	assert.Equal(t, "c/h", ce.Conflicts[0].Path)
	// "replaced", or "content changed" where the new file got the inode
	// number of the one it replaced (ext4 hands a freed one out again).
	assert.Contains(t, []string{"replaced in the original", "content changed in the original"}, ce.Conflicts[0].Reason)
	assert.Equal(t, "someone else's\n", string(mustReadFile(t, h)))
	assert.Equal(t, "a", string(mustReadFile(t, filepath.Join(s.orig, "a", "f"))))
}

// An original on a full filesystem (the upper elsewhere, so new content
// is copied): the commit fails with ENOSPC before touching the original,
// and leaves nothing behind.
func TestENOSPCLeavesOriginalUnchanged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	small := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", small, "tmpfs", 0, "size=512k"))
	t.Cleanup(func() { _ = unix.Unmount(small, unix.MNT_DETACH) })
	orig := filepath.Join(small, "orig")
	require.NoError(t, os.MkdirAll(filepath.Join(orig, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(orig, "d", "keep"), []byte("keep"), 0o644))

	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{orig}}
	require.NoError(t, os.Mkdir(cfg.Upper, 0o700))
	require.NoError(t, os.Mkdir(cfg.Work, 0o700))
	s := &sandbox{t: t, cfg: cfg, orig: orig, ref: t.TempDir()}
	require.NoError(t, os.MkdirAll(filepath.Join(s.ref, "d"), 0o755))
	s.open()
	s.write("d/keep", "changed")
	s.write("big", string(bytes.Repeat([]byte("x"), 2<<20)))
	s.done()
	old := snapshot(t, orig)

	err := commitAll(t, cfg, Options{})
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.ErrorIs(t, err, unix.ENOSPC)
	assert.Equal(t, StagePrepare, ce.Stage, "nothing was applied")
	assert.Equal(t, old, snapshot(t, orig), "the original is unchanged")
	leftovers, _ := filepath.Glob(filepath.Join(orig, ".sbxfs-txn-*"))
	assert.Empty(t, leftovers, "the staging area is cleaned up")
	_, err = os.Stat(filepath.Join(cfg.Work, UndoLogName))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func mustReadFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}

// immutable makes the directory p immutable (chattr +i), so that an apply
// fails there with EPERM, and returns what makes it mutable again (also
// run at cleanup). It skips the test where that cannot be done.
func immutable(t *testing.T, p string) (unlock func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chattr +i needs root")
	}
	if out, err := exec.Command("chattr", "+i", p).CombinedOutput(); err != nil {
		t.Skipf("chattr +i is not supported here: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", p).Run() })
	return func() { require.NoError(t, exec.Command("chattr", "-i", p).Run()) }
}
