package commit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil/fsutiltest"
	"github.com/sbxfs/sbxfs/internal/immutable"
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
	unlock := immutable.Set(t, filepath.Join(s.orig, "z"))

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
	unlock := immutable.Set(t, filepath.Join(s.orig, "a"))

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
	unlock := immutable.Set(t, filepath.Join(s.orig, "b"))

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

// emptyD removes everything in d of TestWriteBetweenTheCheckAndTheApplyIsAConflict's original.
func emptyD(s *sandbox) {
	s.remove("d/s/f")
	s.remove("d/s")
	s.remove("d/a")
}

// assertChangedDuringCommit checks err is the conflict of a commit that
// found path changed (or made: reason) by someone else while it ran, and
// undid itself.
func assertChangedDuringCommit(t *testing.T, err error, path, reason string) *Error {
	t.Helper()
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.ErrorIs(t, err, ErrConflict)
	assert.True(t, ce.RolledBack)
	assert.Equal(t, []Conflict{{Path: path, Reason: reason}}, ce.Conflicts)
	return ce
}

// swapper plays another process that swaps a directory of the original
// (RENAME_EXCHANGE) with a symlink to an empty directory elsewhere.
type swapper struct {
	t         *testing.T
	dir, swap string
	swapped   bool // the symlink stands at dir
}

func newSwapper(t *testing.T, orig, name string) *swapper {
	w := &swapper{t: t, dir: filepath.Join(orig, name), swap: filepath.Join(orig, name+".swap")}
	require.NoError(t, os.Symlink(t.TempDir(), w.swap))
	return w
}

func (w *swapper) exchange() {
	require.NoError(w.t, unix.Renameat2(unix.AT_FDCWD, w.dir, unix.AT_FDCWD, w.swap, unix.RENAME_EXCHANGE))
	w.swapped = !w.swapped
}

// back puts the directory back, if the symlink stands in its place.
func (w *swapper) back() {
	if w.swapped {
		w.exchange()
	}
}

// done removes the symlink, which must be at its own name again.
func (w *swapper) done() {
	require.NoError(w.t, os.Remove(w.swap), "the symlink is at %s again", w.swap)
}

// commitSwappedAt commits s with the symlink swapped in at the fault
// point, and the directory put back once the commit returned; it returns
// the commit's error.
func (w *swapper) commitSwappedAt(s *sandbox, point string) error {
	x, err := Prepare(s.cfg, Options{Fault: func(p string) {
		if p == point {
			w.exchange()
		}
	}})
	require.NoError(w.t, err)
	err = Commit(x)
	w.back()
	w.done()
	return err
}

// TestWriteBetweenTheCheckAndTheApplyIsAConflict: after the conflict
// check passed and before the apply moves it into the backups, another
// writer changes what the commit replaces or removes: a file written to
// (in place, or replaced by a save), a file made where the sandbox makes
// one or at a rename's target, a file made or written in a directory
// the commit removes or replaces. The backups go at the commit point, so
// each would be lost: the commit sees it is not what the check saw, is
// undone and refused, with --force too (which overrides what the check
// showed, not what came after it).
func TestWriteBetweenTheCheckAndTheApplyIsAConflict(t *testing.T) {
	writeFile := func(p, data string) func(t *testing.T, orig string) {
		return func(t *testing.T, orig string) {
			require.NoError(t, os.WriteFile(filepath.Join(orig, p), []byte(data), 0o644))
		}
	}
	setAttr := func(p string) func(t *testing.T, orig string) {
		return func(t *testing.T, orig string) {
			require.NoError(t, unix.Setxattr(filepath.Join(orig, p), "user.other", []byte("set meanwhile"), 0))
		}
	}
	for _, tc := range []struct {
		name    string
		sandbox func(s *sandbox)
		meddle  func(t *testing.T, orig string)
		path    string
		reason  string
		force   bool
	}{
		{"written in place", func(s *sandbox) { s.write("f", "sandbox") },
			writeFile("f", "written meanwhile"), "f", changedDuringCommit, false},
		{"replaced by a save", func(s *sandbox) { s.write("f", "sandbox") },
			func(t *testing.T, orig string) {
				p := filepath.Join(orig, "f")
				require.NoError(t, os.WriteFile(p+".new", []byte("saved meanwhile"), 0o644))
				require.NoError(t, os.Rename(p+".new", p))
			}, "f", changedDuringCommit, false},
		{"written in place, --force", func(s *sandbox) { s.write("f", "sandbox") },
			writeFile("f", "written meanwhile"), "f", changedDuringCommit, true},
		{"an attribute set", func(s *sandbox) { s.write("f", "sandbox") },
			setAttr("f"), "f", changedDuringCommit, false},
		{"an attribute set on a file whose mode the sandbox changes", func(s *sandbox) { s.chmod("f", 0o600) },
			setAttr("f"), "f", changedDuringCommit, false},
		{"an attribute set in a directory the sandbox removes", func(s *sandbox) { emptyD(s); s.remove("d") },
			setAttr("d/s/f"), "d/s/f", changedDuringCommit, false},
		{"saved over a file whose mode the sandbox changes", func(s *sandbox) { s.chmod("f", 0o600) },
			func(t *testing.T, orig string) {
				p := filepath.Join(orig, "f")
				require.NoError(t, os.WriteFile(p+".new", []byte("saved meanwhile"), 0o644))
				require.NoError(t, os.Rename(p+".new", p))
			}, "f", changedDuringCommit, false},
		{"a directory whose mode the sandbox changes replaced", func(s *sandbox) { s.chmod("e", 0o700) },
			func(t *testing.T, orig string) {
				require.NoError(t, os.Rename(filepath.Join(orig, "e"), filepath.Join(orig, "e.old")))
				require.NoError(t, os.Mkdir(filepath.Join(orig, "e"), 0o755))
			}, "e", changedDuringCommit, false},
		{"saved in a directory the sandbox renamed", func(s *sandbox) { s.write("d/a", "sandbox"); s.rename("d", "n2") },
			func(t *testing.T, orig string) {
				p := filepath.Join(orig, "d", "a")
				require.NoError(t, os.WriteFile(p+".new", []byte("saved meanwhile"), 0o644))
				require.NoError(t, os.Rename(p+".new", p))
			}, "n2/a", changedDuringCommit, false},
		{"made where the sandbox makes one", func(s *sandbox) { s.write("n", "sandbox") },
			writeFile("n", "made meanwhile"), "n", madeDuringCommit, false},
		{"made at a rename's target", func(s *sandbox) { s.rename("f", "g") },
			writeFile("g", "made meanwhile"), "g", madeDuringCommit, false},
		{"made in a directory the sandbox removes", func(s *sandbox) { emptyD(s); s.remove("d") },
			writeFile("d/s/new", "made meanwhile"), "d/s/new", madeDuringCommit, false},
		{"written in a directory the sandbox removes", func(s *sandbox) { emptyD(s); s.remove("d") },
			writeFile("d/s/f", "written meanwhile"), "d/s/f", changedDuringCommit, false},
		{"made in a directory the sandbox replaces by a file", func(s *sandbox) { emptyD(s); s.remove("d"); s.write("d", "sandbox") }, writeFile("d/new", "made meanwhile"), "d/new", madeDuringCommit, false},
		{"made in a directory a rename replaces", func(s *sandbox) { emptyD(s); s.rename("e", "d") }, writeFile("d/new", "made meanwhile"), "d/new", madeDuringCommit, false},
		{"made in a directory the sandbox replaces by a new one, --force", func(s *sandbox) { emptyD(s); s.remove("d"); s.mkdir("d") }, writeFile("d/new", "made meanwhile"), "d/new", madeDuringCommit, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"a": "a", "f": "f", "d/a": "a", "d/s/f": "f", "e/y": "y", "z": "z"})
			s.write("a", "sandbox a")
			tc.sandbox(s)
			s.write("z", "sandbox z")
			s.done()
			x, err := Prepare(s.cfg, Options{Force: tc.force})
			require.NoError(t, err)
			tc.meddle(t, s.orig)
			before := snapshot(t, s.orig)
			assertChangedDuringCommit(t, Commit(x), tc.path, tc.reason)
			assert.Equal(t, before, snapshot(t, s.orig), "the commit is undone, the other writer's change kept")
			require.Error(t, commitAll(t, s.cfg, Options{}), "the next commit refuses too")
		})
	}
}

// TestWriteDuringTheCommitIsAConflict: processes that held original
// objects open change them while the commit runs, after the apply moved
// them into the backups: a file written through a descriptor, a file
// made in a directory the commit removes, a file in such a directory
// written. Each would go with the backups at the commit point. The
// commit sees the backups changed before it: a conflict, undone, the
// original as the writers left it.
func TestWriteDuringTheCommitIsAConflict(t *testing.T) {
	removeD := func(s *sandbox) { s.remove("d/a"); s.remove("d") }
	for _, tc := range []struct {
		name   string
		change func(s *sandbox)
		open   string // what the writer holds open (O_WRONLY for a file)
		write  func(t *testing.T, fd int)
		path   string
		reason string
		want   map[string]string // in the original after the undo
	}{
		{"a file written through a descriptor", func(s *sandbox) { s.write("f", "sandbox") }, "f",
			func(t *testing.T, fd int) {
				_, err := unix.Pwrite(fd, []byte("written during the commit"), 0)
				require.NoError(t, err)
			}, "f", changedDuringCommit, map[string]string{"f": "written during the commit"}},
		{"a file made in a directory", removeD, "d",
			func(t *testing.T, fd int) {
				nfd, err := unix.Openat(fd, "made during the commit", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
				require.NoError(t, err)
				unix.Close(nfd)
			}, "d/made during the commit", madeDuringCommit, map[string]string{"d/made during the commit": "", "d/a": "a"}},
		{"a file in a removed directory written", removeD, "d/a",
			func(t *testing.T, fd int) {
				_, err := unix.Pwrite(fd, []byte("written during the commit"), 0)
				require.NoError(t, err)
			}, "d/a", changedDuringCommit, map[string]string{"d/a": "written during the commit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"f": "f", "d/a": "a", "g": "g"})
			tc.change(s)
			s.write("g", "sandbox g")
			s.done()
			flags := unix.O_WRONLY
			if tc.open == "d" {
				flags = unix.O_RDONLY
			}
			fd, err := unix.Open(filepath.Join(s.orig, tc.open), flags|unix.O_CLOEXEC, 0)
			require.NoError(t, err)
			defer unix.Close(fd)
			x, err := Prepare(s.cfg, Options{Fault: func(point string) {
				if point == "applied" {
					tc.write(t, fd)
				}
			}})
			require.NoError(t, err)
			before := snapshot(t, s.orig)
			ce := assertChangedDuringCommit(t, Commit(x), tc.path, tc.reason)
			after := snapshot(t, s.orig)
			assert.Equal(t, before["g"], after["g"], "the rest is undone")
			for p, want := range tc.want {
				b, err := os.ReadFile(filepath.Join(s.orig, p))
				require.NoError(t, err)
				assert.Equal(t, want, string(b), "%s is in the original as the writer left it", p)
			}
			// The undo does not take the written object for the base:
			// the next commit refuses too.
			err = commitAll(t, s.cfg, Options{})
			require.ErrorAs(t, err, &ce, "the retry must see the write as a conflict")
			assert.ErrorIs(t, err, ErrConflict)
		})
	}
}

// TestCommitOverOriginalHardLinks: the apply's own steps change an
// original inode that has another name beneath a directory the commit
// removes (moved into the backups: its ctime; given the sandbox's mode:
// its mode and ctime). What the commit did itself is no change by
// someone else: it commits.
func TestCommitOverOriginalHardLinks(t *testing.T) {
	removeD := func(s *sandbox) {
		s.remove("d/s/f")
		s.remove("d/s/g")
		s.remove("d/s")
		s.remove("d")
	}
	for _, tc := range []struct {
		name   string
		change func(s *sandbox)
	}{
		{"one name written", func(s *sandbox) { s.write("f", "sandbox") }},
		{"one name chmodded", func(s *sandbox) { s.chmod("f", 0o600) }},
		{"one name given an attribute", func(s *sandbox) { s.setxattr("f", "user.sandbox", "x") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"f": "f", "d/s/g": "g"})
			for _, root := range []string{s.orig, s.ref} {
				require.NoError(t, os.Link(filepath.Join(root, "f"), filepath.Join(root, "d/s/f")))
			}
			tc.change(s)
			removeD(s)
			s.done()
			require.NoError(t, commitAll(t, s.cfg, Options{}))
			assert.NoDirExists(t, filepath.Join(s.orig, "d"))
		})
	}
}

// TestUndoOfATransactionNeverApplied: a plan undoes every sandbox when
// one fails, also those whose apply never ran. Such an undo changes
// nothing: the old metadata its metadata steps recorded would go over
// what another writer set since the staging.
func TestUndoOfATransactionNeverApplied(t *testing.T) {
	s := newSandbox(t, map[string]string{"f": "f"})
	s.chmod("f", 0o600)
	s.done()
	x, err := Prepare(s.cfg, Options{})
	require.NoError(t, err)
	p := filepath.Join(s.orig, "f")
	require.NoError(t, unix.Setxattr(p, "user.other", []byte("set meanwhile"), 0))
	require.NoError(t, os.Chmod(p, 0o640))
	require.NoError(t, x.Undo())
	st, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm())
	buf := make([]byte, 64)
	n, err := unix.Getxattr(p, "user.other", buf)
	require.NoError(t, err)
	assert.Equal(t, "set meanwhile", string(buf[:n]))
}

// TestWriteToWhatTheCommitPutInPlaceSurvivesItsUndo: while the commit
// runs, another process writes to a file the commit installed, or makes
// a file in a directory the commit made, and the commit is then undone
// (here because the same process also wrote to a file the commit backed
// up). Moved back into the transaction directory, the write would be
// discarded with it: the undo leaves such an object in place and says
// so, keeping the transaction directory and the undo log (exit 8 from
// the CLI); a later recovery does the same.
func TestWriteToWhatTheCommitPutInPlaceSurvivesItsUndo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sandbox func(s *sandbox)
		other   func(t *testing.T, orig string)
		path    string // left in place
		want    map[string]string
	}{
		{"a file it installed, written", func(s *sandbox) { s.write("n", "sandbox n") },
			func(t *testing.T, orig string) {
				f, err := os.OpenFile(filepath.Join(orig, "n"), os.O_WRONLY|os.O_APPEND, 0)
				require.NoError(t, err)
				_, err = f.WriteString(" and more")
				require.NoError(t, err)
				require.NoError(t, f.Close())
			},
			"n", map[string]string{"n": "sandbox n and more"}},
		{"a directory it made, given a file", func(s *sandbox) { s.mkdir("nd"); s.write("nd/x", "x") },
			func(t *testing.T, orig string) { writeFile(t, filepath.Join(orig, "nd", "other"), "other") },
			"nd", map[string]string{"nd/other": "other"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"f": "f"})
			s.write("f", "sandbox f")
			tc.sandbox(s)
			s.done()
			fd, err := unix.Open(filepath.Join(s.orig, "f"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
			require.NoError(t, err)
			defer unix.Close(fd)
			x, err := Prepare(s.cfg, Options{Fault: func(point string) {
				if point == "applied" {
					_, err := unix.Pwrite(fd, []byte("F"), 0)
					require.NoError(t, err)
					tc.other(t, s.orig)
				}
			}})
			require.NoError(t, err)
			err = Commit(x)
			var ce *Error
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, StageUndo, ce.Stage)
			assert.Contains(t, ce.Paths, tc.path)
			assert.NotEmpty(t, ce.Kept)
			assert.Contains(t, err.Error(), "another process")
			for p, want := range tc.want {
				b, err := os.ReadFile(filepath.Join(s.orig, p))
				require.NoError(t, err)
				assert.Equal(t, want, string(b))
			}
			b, err := os.ReadFile(filepath.Join(s.orig, "f"))
			require.NoError(t, err)
			assert.Equal(t, "F", string(b), "the backed-up file is back, with the write")

			// A recovery (another process, as every command runs first)
			// knows it from the undo log, and leaves it in place too.
			x.Close()
			_, err = Recover(s.cfg, RecoverOptions{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "another process")
			for p, want := range tc.want {
				b, err := os.ReadFile(filepath.Join(s.orig, p))
				require.NoError(t, err)
				assert.Equal(t, want, string(b), "after the recovery")
			}
		})
	}
}

// TestMetadataStepOfAnOriginalUnreadableAtStaging: between the conflict
// check and the staging, another process swaps a directory whose mode the
// sandbox changed for a symlink, and swaps it back before the apply. The
// staging could not read the metadata the undo would set back: the
// commit must fail there, the original untouched, rather than apply a
// step it cannot undo.
func TestMetadataStepOfAnOriginalUnreadableAtStaging(t *testing.T) {
	s := newSandbox(t, map[string]string{"d/sub/f": "f", "a": "a"})
	s.chmod("d/sub", 0o700)
	s.write("a", "sandbox")
	s.done()
	before := snapshot(t, s.orig)
	w := newSwapper(t, s.orig, "d")
	x, err := Prepare(s.cfg, Options{Fault: func(point string) {
		if point == "checked" || point == "staged" && w.swapped {
			w.exchange()
		}
	}})
	w.back()
	if err == nil {
		// Applied, then undone: the undo must set the old mode back.
		require.NoError(t, x.Apply())
		require.NoError(t, x.Undo())
	}
	w.done()
	assert.Equal(t, before, snapshot(t, s.orig), "the original as it was")
	var ce *Error
	require.ErrorAs(t, err, &ce, "the staging could not read d/sub")
	assert.Equal(t, StagePrepare, ce.Stage)
	assert.Equal(t, []Conflict{{Path: "d/sub", Reason: ReasonChangedWhileRead}}, ce.Conflicts)
	require.NoError(t, commitAll(t, s.cfg, Options{}), "once the original is still, the commit goes through")
}

// TestRenamedDirectorySwappedForASymlinkBeforeTheApply: after the
// staging, another process swaps a directory the sandbox renamed for a
// symlink. The apply must not move the symlink under the new name (its
// undo then left it there and the directory nowhere): the directory is
// not the one staged, a conflict, and the original is as the other
// process left it.
func TestRenamedDirectorySwappedForASymlinkBeforeTheApply(t *testing.T) {
	s := newSandbox(t, map[string]string{"d/f": "f", "d/g": "g", "a": "a"})
	s.write("d/f", "sandbox")
	s.rename("d", "renamed")
	s.done()
	before := snapshot(t, s.orig)
	err := newSwapper(t, s.orig, "d").commitSwappedAt(s, "staged")
	assertChangedDuringCommit(t, err, "d", changedDuringCommit)
	assert.Equal(t, before, snapshot(t, s.orig), "the original as it was")
	require.NoError(t, commitAll(t, s.cfg, Options{}), "once the original is still, the commit goes through")
	b, err := os.ReadFile(filepath.Join(s.orig, "renamed/f"))
	require.NoError(t, err)
	assert.Equal(t, "sandbox", string(b))
}

// TestMetadataSetDuringTheCommitSurvivesItsUndo: the apply gives a file
// the sandbox's mode and an attribute; then another process changes its
// mode and sets an attribute of its own, and the commit is undone (in the
// same process after a conflict, or by a recovery after a crash). The
// undo sets back what the step set and nobody changed since (the
// sandbox's attribute goes), and keeps the other process's mode and
// attribute: until 2026-11-26 it set the whole old metadata back.
func TestMetadataSetDuringTheCommitSurvivesItsUndo(t *testing.T) {
	for _, how := range []string{"undo", "recovery"} {
		t.Run(how, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"f": "f", "g": "g"})
			s.chmod("f", 0o600)
			s.setxattr("f", "user.sandbox", "s")
			s.write("g", "sandbox g")
			s.done()
			p := filepath.Join(s.orig, "f")
			fd, err := unix.Open(filepath.Join(s.orig, "g"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
			require.NoError(t, err)
			defer unix.Close(fd)
			other := func() {
				st, err := os.Stat(p)
				require.NoError(t, err)
				require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the apply set the sandbox's mode")
				require.NoError(t, os.Chmod(p, 0o640))
				require.NoError(t, unix.Setxattr(p, "user.other", []byte("o"), 0))
				_, err = unix.Pwrite(fd, []byte("G"), 0) // a conflict: the commit is undone
				require.NoError(t, err)
			}
			x, err := Prepare(s.cfg, Options{Fault: func(point string) {
				if point == "applied" {
					other()
				}
			}})
			require.NoError(t, err)
			if how == "undo" {
				assertChangedDuringCommit(t, Commit(x), "g", changedDuringCommit)
			} else {
				require.NoError(t, x.Apply())
				x.Close() // as a crash would leave it
				r, err := Recover(s.cfg, RecoverOptions{})
				require.NoError(t, err)
				assert.Equal(t, "undone", r.Action)
			}
			st, err := os.Stat(p)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o640), st.Mode().Perm(), "the other process's mode")
			buf := make([]byte, 16)
			n, err := unix.Getxattr(p, "user.other", buf)
			require.NoError(t, err)
			assert.Equal(t, "o", string(buf[:n]), "the other process's attribute")
			_, err = unix.Getxattr(p, "user.sandbox", buf)
			assert.ErrorIs(t, err, unix.ENODATA, "the sandbox's attribute is undone")
			b, err := os.ReadFile(filepath.Join(s.orig, "g"))
			require.NoError(t, err)
			assert.Equal(t, "G", string(b), "the backed-up file is back, with the write")
		})
	}
}

// TestRenamedDirectoryReplacedBeforeItsMetadataStep: the sandbox renamed
// d to e and changed e's mode. After the apply moved d to e, and before
// the metadata step, another process moves e away and makes a directory
// of its own there. The sandbox's mode must not go on that directory:
// the step checks the inode it is for, a conflict, and nothing is lost.
func TestRenamedDirectoryReplacedBeforeItsMetadataStep(t *testing.T) {
	s := newSandbox(t, map[string]string{"d/x": "x", "a/f1": "1", "a/f2": "2", "a/f3": "3", "a/f4": "4"})
	var d unix.Stat_t
	require.NoError(t, unix.Lstat(filepath.Join(s.orig, "d"), &d))
	s.rename("d", "e")
	s.chmod("e", 0o700)
	for _, f := range []string{"a/f1", "a/f2", "a/f3", "a/f4"} {
		s.chmod(f, 0o600) // metadata steps before e's (children first), so that "applying" comes between
	}
	s.done()
	e := filepath.Join(s.orig, "e")
	x, err := Prepare(s.cfg, Options{Fault: func(point string) {
		if point != "applying" {
			return
		}
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(e, &st))
		require.Equal(t, d.Ino, st.Ino, "the apply moved d to e before the midpoint")
		require.NoError(t, os.Rename(e, e+".moved"))
		require.NoError(t, os.Mkdir(e, 0o755))
	}})
	require.NoError(t, err)
	assertChangedDuringCommit(t, Commit(x), "e", changedDuringCommit)
	st, err := os.Stat(e)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm(), "the other process's directory keeps its mode")
	b, err := os.ReadFile(filepath.Join(e+".moved", "x"))
	require.NoError(t, err)
	assert.Equal(t, "x", string(b), "the moved directory keeps its file")
}

// TestSymlinkSwappedInAtTheHeldLook: while Prepare records what the
// original holds where the apply will back up, a directory of the
// original is swapped for a symlink for a moment. Recorded as unknown,
// the path would go unchecked by the apply, and a write to the file in
// it lost with the backups: the look is a conflict of its own, even
// when the conflict check after it finds the directory back. A write
// made once it is back is a conflict of the check, and stays.
func TestSymlinkSwappedInAtTheHeldLook(t *testing.T) {
	for _, write := range []bool{false, true} {
		t.Run(fmt.Sprintf("write=%v", write), func(t *testing.T) {
			s := newSandbox(t, map[string]string{"d/f": "f", "a": "a"})
			s.write("d/f", "sandbox")
			s.done()
			w := newSwapper(t, s.orig, "d")
			x, err := Prepare(s.cfg, Options{Fault: func(point string) {
				switch {
				case point == "planned":
					w.exchange()
				case point == "held" && w.swapped:
					w.exchange()
					if write {
						writeFile(t, filepath.Join(s.orig, "d", "f"), "written meanwhile")
					}
				}
			}})
			w.back()
			if err == nil {
				err = Commit(x)
			}
			w.done()
			var ce *Error
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, StagePrepare, ce.Stage)
			if !write {
				assert.Equal(t, []Conflict{{Path: "d/f", Reason: ReasonChangedWhileRead}}, ce.Conflicts)
				require.NoError(t, commitAll(t, s.cfg, Options{}), "once the original is still, the commit goes through")
				return
			}
			assert.Equal(t, []Conflict{{Path: "d/f", Reason: "content changed in the original"}}, ce.Conflicts)
			b, err := os.ReadFile(filepath.Join(s.orig, "d", "f"))
			require.NoError(t, err)
			assert.Equal(t, "written meanwhile", string(b))
		})
	}
}

// TestUndoWaitsOutASymlinkSwappedInForAMoment: while a commit is undone
// (another writer wrote to a file it backed up), a directory the undo
// puts files back into is swapped for a symlink for a moment. The steps
// beneath it meet the symlink; the undo tries them again once it is
// gone, and finishes: the commit is undone, not left for a recovery
// with its backups kept (exit 8 from the CLI).
func TestUndoWaitsOutASymlinkSwappedInForAMoment(t *testing.T) {
	s := newSandbox(t, map[string]string{"d/f": "f", "g": "g"})
	s.write("d/f", "sandbox")
	s.write("g", "sandbox")
	s.done()
	fd, err := unix.Open(filepath.Join(s.orig, "g"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	w := newSwapper(t, s.orig, "d")
	var back sync.WaitGroup
	x, err := Prepare(s.cfg, Options{Fault: func(point string) {
		switch point {
		case "applied":
			_, err := unix.Pwrite(fd, []byte("G"), 0) // a conflict: the commit is undone
			require.NoError(t, err)
		case "undoing":
			w.exchange()
			back.Add(1)
			time.AfterFunc(20*time.Millisecond, func() {
				defer back.Done()
				assert.NoError(t, unix.Renameat2(unix.AT_FDCWD, w.dir, unix.AT_FDCWD, w.swap, unix.RENAME_EXCHANGE))
			})
		}
	}})
	require.NoError(t, err)
	err = Commit(x)
	back.Wait()
	w.done()
	ce := assertChangedDuringCommit(t, err, "g", changedDuringCommit)
	assert.Empty(t, ce.Kept, "nothing left for a recovery")
	assert.Equal(t, "f", readFile(t, filepath.Join(s.orig, "d/f")), "d/f is back")
	assert.Equal(t, "G", readFile(t, filepath.Join(s.orig, "g")), "g is back, with the write")
}

// TestSymlinkSwappedInDuringTheApply: after the staging, before the apply
// reaches a file the sandbox wrote, another process swaps the directory
// it is in for a symlink. The step meets the symlink: the commit is
// undone (the file written before it is the original's again) and
// refused as a conflict of the original changing while the commit ran,
// not failed: once the directory is back, the next commit goes through.
func TestSymlinkSwappedInDuringTheApply(t *testing.T) {
	s := newSandbox(t, map[string]string{"a": "a", "d/f": "f"})
	s.write("a", "sandbox a")
	s.write("d/f", "sandbox f")
	s.done()
	before := snapshot(t, s.orig)
	err := newSwapper(t, s.orig, "d").commitSwappedAt(s, "prepared")
	ce := assertChangedDuringCommit(t, err, "d/f", ReasonChangedWhileRead)
	assert.Equal(t, StageApply, ce.Stage)
	assert.True(t, ce.WhileRead())
	assert.Equal(t, before, snapshot(t, s.orig), "the original after the undo")
	require.NoError(t, commitAll(t, s.cfg, Options{}), "once the original is still, the commit goes through")
	assert.Equal(t, "sandbox a", readFile(t, filepath.Join(s.orig, "a")))
	assert.Equal(t, "sandbox f", readFile(t, filepath.Join(s.orig, "d", "f")))
}

// A sandbox that replaced an original file by a directory commits again
// after its commit was undone. The undo records the file it put back
// (rebase.json), and withMissingDirs took the directory of the new
// entries for one the original had lost: it added its creation a second
// time, and every retry failed with "file exists", the sandbox stuck.
func TestRetryOfAFileReplacedByADirectoryAfterAnUndo(t *testing.T) {
	s := newSandbox(t, map[string]string{"other": "o", "zz/f": "f"})
	s.remove("other")
	s.mkdir("other")
	s.write("other/x", "x")
	s.write("zz/g", "g")
	s.done()
	old := snapshotTimes(t, s.orig)
	unlock := immutable.Set(t, filepath.Join(s.orig, "zz"))
	require.Error(t, commitAll(t, s.cfg, Options{}))
	assert.Equal(t, old, snapshotTimes(t, s.orig))
	unlock()
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	assert.Equal(t, snapshot(t, s.ref), snapshot(t, s.orig))
}

// TestWriteAtEachPointOfPrepareIsKept: the sandbox changed f and removed
// d; at each point of Prepare another writer saves f anew (a rename over
// it) and makes d/new. Wherever it comes, the commit refuses (at the
// check, or at the apply, undone) and both are in the original. Until
// 2026-11-28 what the original held was recorded after the check, and a
// write between the two was neither a conflict nor a change since the
// record: the commit succeeded and the backups took both away (found by
// review).
func TestWriteAtEachPointOfPrepareIsKept(t *testing.T) {
	for _, point := range FaultPoints[:slices.Index(FaultPoints, "applying")] {
		t.Run(point, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"f": "original", "d/g": "original g", "a": "a"})
			s.write("f", "sandbox")
			s.remove("d/g")
			s.remove("d")
			s.write("a", "sandbox a")
			s.done()
			wrote := false
			x, err := Prepare(s.cfg, Options{Fault: func(p string) {
				if p != point {
					return
				}
				wrote = true
				writeFile(t, filepath.Join(s.orig, "f.tmp"), "the other writer's save")
				require.NoError(t, os.Rename(filepath.Join(s.orig, "f.tmp"), filepath.Join(s.orig, "f")))
				writeFile(t, filepath.Join(s.orig, "d", "new"), "the other writer's new file")
			}})
			require.True(t, wrote, "Prepare passed %s", point)
			if err == nil {
				err = Commit(x)
			}
			require.Error(t, err, "a commit over the other writer's files")
			assert.ErrorIs(t, err, ErrConflict)
			b, err := os.ReadFile(filepath.Join(s.orig, "f"))
			require.NoError(t, err)
			assert.Equal(t, "the other writer's save", string(b))
			b, err = os.ReadFile(filepath.Join(s.orig, "d", "new"))
			require.NoError(t, err)
			assert.Equal(t, "the other writer's new file", string(b))
			b, err = os.ReadFile(filepath.Join(s.orig, "a"))
			require.NoError(t, err)
			assert.Equal(t, "a", string(b), "nothing of the sandbox's applied")
		})
	}
}

// TestTxnDirSwappedForASymlinkDuringStaging: the original is on another
// filesystem than the sandbox, so the commit stages copies in
// ORIGINAL/.sbxfs-txn-ID. Once it is made, another process that may
// write the original's root moves it out of the original and puts a
// symlink to a directory of its own there, with a file of its own. The
// staging must go on into the directory it made (private, wherever it
// is), never through the symlink: nothing of the sandbox's lands in the
// other process's directory, and its file keeps its mode. Until
// 2026-11-28 the staging made and chmodded each copy by path: every
// copy after the swap was made in the other directory (a setuid file
// too), and a symlink put at a copy's name between its creation and its
// chmod had the root committer chmod the symlink's target (found by
// review, by racing a real swap).
func TestTxnDirSwappedForASymlinkDuringStaging(t *testing.T) {
	fs := fsutiltest.MountExt4(t, "", "-O", "has_journal")
	s := newSandboxIn(t, fs, t.TempDir(), map[string]string{"keep": "k"})
	for i := range 20 {
		s.write(fmt.Sprintf("f%02d", i), "sandbox data")
	}
	s.write("suid", "a program")
	s.chmod("suid", 0o4755)
	s.symlink("f00", "link")
	s.done()
	other := filepath.Join(fs, "other")
	require.NoError(t, os.Mkdir(other, 0o777))
	for _, sub := range []string{"b", "s", "m"} {
		require.NoError(t, os.Mkdir(filepath.Join(other, sub), 0o777))
	}
	victim := filepath.Join(other, "victim")
	writeFile(t, victim, "the other process's file")
	require.NoError(t, os.Chmod(victim, 0o600))
	moved := filepath.Join(fs, "moved")
	x, err := Prepare(s.cfg, Options{Fault: func(p string) {
		if p != "staging" {
			return
		}
		dirs, err := filepath.Glob(filepath.Join(s.orig, ".sbxfs-txn-*"))
		require.NoError(t, err)
		require.Len(t, dirs, 1, "the transaction directory is in the original")
		require.NoError(t, os.Rename(dirs[0], moved))
		require.NoError(t, os.Symlink(other, dirs[0]))
	}})
	if err == nil {
		err = Commit(x)
	}
	t.Logf("commit: %v", err)
	for _, sub := range []string{"b", "s", "m"} {
		ents, rerr := os.ReadDir(filepath.Join(other, sub))
		require.NoError(t, rerr)
		assert.Empty(t, ents, "nothing of the commit's in the other process's %s", sub)
	}
	st, rerr := os.Stat(victim)
	require.NoError(t, rerr)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the other process's file keeps its mode")
	assert.Equal(t, "the other process's file", readFile(t, victim))
	if err == nil {
		// Staged through the moved directory, applied: the original
		// holds the sandbox's files.
		assert.Equal(t, "sandbox data", readFile(t, filepath.Join(s.orig, "f19")))
		st, rerr := os.Lstat(filepath.Join(s.orig, "suid"))
		require.NoError(t, rerr)
		assert.Equal(t, os.FileMode(0o755)|os.ModeSetuid, st.Mode()&(os.ModePerm|os.ModeSetuid))
	}
}
