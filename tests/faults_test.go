package tests

// Faults on real mounts: a full upper, a server killed under load, an
// original changed underneath, an original that refuses the commit, a
// stale mount, a full original. The server is always a separate process
// (the sbxfs CLI); commits go through the CLI.

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const cliTimeout = 60 * time.Second

// unchangedOpts compares an original a failed commit must leave as it
// was: snapshotOpts without ctime, which an undone commit changes by
// design (it moves objects away and back by rename, docs/commit.md), and
// which the staging directory it makes and removes in the original's root
// changes too. Inode numbers, content, modes, owners, mtimes and
// attributes must all be as before.
var unchangedOpts = walkOpts{xattr: allXattrs, owner: true, mtime: true, ino: true}

// fillResult is what writers that ran until the disk was full achieved.
type fillResult struct {
	mu     sync.Mutex
	ok     map[string][]byte // written, fsynced and closed without error
	failed map[string]error  // the write that hit the error (the file may be partial)
}

// fillUntilFull runs writers that each create files of size bytes in dir
// (write, fsync, close) until one step fails, at most limit files each.
func fillUntilFull(dir, prefix string, writers, size, limit int) *fillResult {
	res := &fillResult{ok: map[string][]byte{}, failed: map[string]error{}}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range limit {
				name := fmt.Sprintf("%s-w%d-%03d", prefix, w, i)
				data := patterned(name, size)
				err := writeFsync(filepath.Join(dir, name), data, os.O_EXCL)
				res.mu.Lock()
				if err != nil {
					res.failed[name] = err
				} else {
					res.ok[name] = data
				}
				res.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return res
}

// checkFill checks that every writer stopped on ENOSPC and that every
// file whose fsync succeeded reads back whole through the mount and is
// whole in the upper.
func checkFill(t *testing.T, sb *sandbox, res *fillResult) {
	t.Helper()
	require.NotEmpty(t, res.ok, "no file could be written before the upper was full")
	require.NotEmpty(t, res.failed, "the writers never hit a full upper")
	for name, err := range res.failed {
		assert.Equal(t, "ENOSPC", errnoName(errnoOf(err)), "%s: a write to a full upper failed with %v", name, err)
	}
	for name, data := range res.ok {
		got, err := os.ReadFile(sb.path(name))
		if assert.NoError(t, err, "fsynced %s", name) {
			assert.True(t, string(got) == string(data), "fsynced %s reads back %d bytes, want its %d bytes", name, len(got), len(data))
		}
		up, err := os.ReadFile(sb.upperPath(name))
		if assert.NoError(t, err, "fsynced %s in the upper", name) {
			assert.True(t, string(up) == string(data), "fsynced %s has %d bytes in the upper, want its %d bytes", name, len(up), len(data))
		}
	}
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	return int64(st.Bavail) * st.Bsize
}

// TestFaultUpperFull: the sandbox directory lives on an 8 MiB tmpfs.
// Writers in the mount get ENOSPC, every file written and fsynced before
// is intact, the mount keeps serving, rollback empties the sandbox, and a
// commit of a full sandbox either succeeds with exactly the sandbox's
// content or fails leaving the original unchanged, and succeeds once
// there is room.
func TestFaultUpperFull(t *testing.T) {
	requireCLI(t)
	orig := newOrig(t, map[string]string{"keep.txt": "keep", "mod.txt": "original\n", "dir/a": "a"})
	small := tmpfsDir(t, "8m")
	sb := mountSandboxAt(t, orig, filepath.Join(small, "sb"), allowServerErrors())
	before := mustWalk(t, orig, unchangedOpts)
	strict := mustWalk(t, orig, snapshotOpts)

	require.NoError(t, appendFile(sb.path("mod.txt"), []byte("changed\n")))
	res := fillUntilFull(sb.mnt, "fill", 2, 512<<10, 64)
	t.Logf("first fill: %d files written, %d writers stopped: %v", len(res.ok), len(res.failed), res.failed)
	checkFill(t, sb, res)
	assert.Less(t, freeBytes(t, small), int64(256<<10), "the tmpfs is full")

	// The full mount still serves reads, of the original and of the upper.
	assert.Equal(t, "keep", mustRead(t, sb.path("keep.txt")))
	assert.Equal(t, "original\nchanged\n", mustRead(t, sb.path("mod.txt")))
	assert.Contains(t, listDir(t, sb.mnt), "dir")
	// A small write may still fit (a page of the journal, say) or not;
	// either way it must be a clean answer.
	err := os.WriteFile(sb.path("tiny"), []byte("t"), 0o644)
	assert.True(t, err == nil || errnoOf(err) == unix.ENOSPC, "small write to a full upper: %v", err)

	// Space can be freed through the mount: a delete on a full upper
	// works, and then a write fits again.
	for name := range res.ok {
		require.NoError(t, os.Remove(sb.path(name)), "delete %s from a full upper", name)
		break
	}
	require.NoError(t, os.WriteFile(sb.path("after-delete"), []byte("fits\n"), 0o644), "write once space was freed")

	// status works on a full sandbox.
	r := sbxfsCLI(t, cliTimeout, "status", sb.mnt)
	assert.Equal(t, 0, r.code, "status of a full sandbox: %s", r)

	// Rollback (keeping the mount) frees the space and leaves the
	// original as it was.
	r = sbxfsCLI(t, cliTimeout, "rollback", "--keep", sb.mnt)
	require.Equal(t, 0, r.code, "rollback of a full sandbox: %s", r)
	assertSameTree(t, strict, mustWalk(t, orig, snapshotOpts), "the original after rollback")
	assert.Equal(t, "original\n", mustRead(t, sb.path("mod.txt")), "mod.txt after rollback")
	for name := range res.ok {
		_, err = os.Stat(sb.path(name))
		assert.ErrorIs(t, err, os.ErrNotExist, "a file of the sandbox after rollback")
		break
	}
	assert.Greater(t, freeBytes(t, small), int64(6<<20), "rollback frees the upper's space")

	// Fill it again, then commit while it is full.
	require.NoError(t, appendFile(sb.path("mod.txt"), []byte("second\n")))
	res = fillUntilFull(sb.mnt, "again", 1, 768<<10, 64)
	t.Logf("second fill: %d files written; stopped on %v", len(res.ok), res.failed)
	checkFill(t, sb, res)
	view := mustWalk(t, sb.mnt, viewOpts)

	r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	t.Logf("commit of a full sandbox: %s", r)
	if r.code != 0 {
		assertCleanCLIError(t, r, exitCommitFailedCode)
		assertSameTree(t, before, mustWalk(t, orig, unchangedOpts), "the original after a failed commit")
		assertSameTree(t, view, mustWalk(t, sb.mnt, viewOpts), "the sandbox after a failed commit")
		leftovers, _ := filepath.Glob(filepath.Join(orig, ".sbxfs-txn-*"))
		assert.Empty(t, leftovers, "staging left in the original")
		// Fix the cause, retry.
		resizeTmpfs(t, small, "32m")
		r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
		require.Equal(t, 0, r.code, "commit once there is room: %s", r)
	}
	assertSameTree(t, view, mustWalk(t, orig, viewOpts), "the original after the commit (want = the sandbox before it)")
	for name, data := range res.ok {
		assert.True(t, string(data) == mustRead(t, filepath.Join(orig, name)), "committed %s", name)
	}
	_, mounted := mountAt(sb.mnt)
	assert.False(t, mounted, "the commit unmounts the sandbox")
}

// The exit codes of cmd/sbxfs/exitcodes.go the tests check.
const (
	exitUsageCode        = 2
	exitBadPathCode      = 3
	exitBusyCode         = 4
	exitNotSbxfsCode     = 6
	exitConflictCode     = 7
	exitCommitFailedCode = 8
)

// TestFaultKillUnderLoad: writers write and fsync files, and extend
// original files, in the mount; the server is SIGKILLed in the middle.
// After the dead mount is cleaned up and the same sandbox directory is
// mounted again, every write whose fsync returned success is there with
// its content, and the sandbox commits.
func TestFaultKillUnderLoad(t *testing.T) {
	requireCLI(t)
	const writers = 4
	files := map[string]string{}
	for w := range writers {
		for k := range 30 {
			files[fmt.Sprintf("o-%d-%02d", w, k)] = fmt.Sprintf("original %d %d\n", w, k)
		}
	}
	orig := newOrig(t, files)
	sb := mountSandbox(t, orig, allowServerErrors())

	var (
		mu      sync.Mutex
		durable = map[string]string{} // path -> content after a successful fsync
	)
	stop := make(chan struct{})
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			k := 0
			for i := 0; ; i++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				var name, content string
				var err error
				if i%4 == 3 && k < 30 {
					// Extend an original file (copy-up), then fsync.
					name = fmt.Sprintf("o-%d-%02d", w, k)
					k++
					add := fmt.Sprintf("appended by writer %d at %d\n", w, i)
					content = files[name] + add
					err = appendFsync(sb.path(name), []byte(add))
				} else {
					name = fmt.Sprintf("new-%d-%04d", w, i)
					content = string(patterned(name, 1+rng.IntN(96<<10)))
					err = writeFsync(sb.path(name), []byte(content), os.O_EXCL)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				durable[name] = content
				mu.Unlock()
			}
		}()
	}
	time.Sleep(800 * time.Millisecond)
	sb.kill(t)
	close(stop)
	for range writers {
		select {
		case err := <-errs:
			if err != nil {
				t.Logf("a writer stopped with %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a writer hangs on the dead mount")
		}
	}
	mu.Lock()
	want := durable
	mu.Unlock()
	require.Greater(t, len(want), 20, "too few writes finished before the kill to mean anything")
	t.Logf("%d writes were fsynced before the kill", len(want))

	unmountStale(t, sb)
	sb.start(t)
	bad := 0
	for name, content := range want {
		got, err := os.ReadFile(sb.path(name))
		if err != nil || string(got) != content {
			if bad++; bad <= 10 {
				t.Errorf("after the kill and remount, fsynced %s: %d bytes, err %v; want its %d bytes", name, len(got), err, len(content))
			}
		}
	}
	view := mustWalk(t, sb.mnt, viewOpts)
	r := sbxfsCLI(t, cliTimeout, "commit", "-m", "after a kill", sb.mnt)
	require.Equal(t, 0, r.code, "commit after the kill and remount: %s", r)
	assertSameTree(t, view, mustWalk(t, orig, viewOpts), "the original after the commit (want = the sandbox before it)")
	for name, content := range want {
		if b, err := os.ReadFile(filepath.Join(orig, name)); err != nil || string(b) != content {
			if bad++; bad <= 20 {
				t.Errorf("committed %s: %d bytes, err %v; want its %d bytes", name, len(b), err, len(content))
			}
		}
	}
}

func appendFsync(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// TestFaultOriginalChangedUnderneath: the original changes behind a
// mounted sandbox. The commit is refused with exit code 7 naming every
// conflicting path and applies nothing (not even the changes that do not
// conflict); rollback discards the sandbox and the original keeps the
// outside change.
func TestFaultOriginalChangedUnderneath(t *testing.T) {
	requireCLI(t)
	orig := newOrig(t, map[string]string{"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "dir/d.txt": "d\n", "e.txt": "e\n"})
	sb := mountSandbox(t, orig)
	require.NoError(t, appendFile(sb.path("a.txt"), []byte("sandbox\n")))
	require.NoError(t, appendFile(sb.path("b.txt"), []byte("sandbox\n")))
	require.NoError(t, os.WriteFile(sb.path("new.txt"), []byte("sandbox new\n"), 0o644))
	require.NoError(t, os.Remove(sb.path("c.txt")))
	require.NoError(t, os.Chmod(sb.path("e.txt"), 0o600))
	require.NoError(t, os.WriteFile(sb.path("dir/d.txt"), []byte("sandbox d\n"), 0o644))
	view := mustWalk(t, sb.mnt, viewOpts)

	// Outside: a.txt rewritten, new.txt made, c.txt replaced, dir/d.txt
	// chmodded. e.txt and b.txt are left alone.
	require.NoError(t, os.WriteFile(filepath.Join(orig, "a.txt"), []byte("outside\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(orig, "new.txt"), []byte("outside new\n"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(orig, "c.txt")))
	require.NoError(t, os.WriteFile(filepath.Join(orig, "c.txt"), []byte("outside c\n"), 0o644))
	require.NoError(t, os.Chmod(filepath.Join(orig, "dir/d.txt"), 0o640))
	outside := mustWalk(t, orig, snapshotOpts)

	r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	assertCleanCLIError(t, r, exitConflictCode)
	for _, p := range []string{"a.txt", "new.txt", "c.txt", "dir/d.txt"} {
		assert.Contains(t, r.stderr, p, "the conflict message names %s", p)
	}
	for _, p := range []string{"b.txt", "e.txt"} {
		assert.NotContains(t, r.stderr, "  "+p+":", "%s does not conflict", p)
	}
	assert.Contains(t, r.stderr, "--force", "the message says what to do")
	assertSameTree(t, outside, mustWalk(t, orig, snapshotOpts), "the original after a refused commit")
	assertSameTree(t, view, mustWalk(t, sb.mnt, viewOpts), "the sandbox after a refused commit")

	// Refused again the same way: nothing was half done.
	r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	assertCleanCLIError(t, r, exitConflictCode)

	r = sbxfsCLI(t, cliTimeout, "rollback", sb.mnt)
	require.Equal(t, 0, r.code, "rollback: %s", r)
	assertSameTree(t, outside, mustWalk(t, orig, snapshotOpts), "the original after rollback keeps the outside change")
	_, mounted := mountAt(sb.mnt)
	assert.False(t, mounted, "rollback unmounts the sandbox")
	assert.NoDirExists(t, sb.state, "rollback removes the sandbox directory")
}

// TestFaultCreatedOnBothSides: the sandbox creates a file and the
// original gets a file of the same name behind it. Nothing else
// conflicts, so nothing hides the conflict: the commit must refuse (exit
// 7, the path named) and the outside file must survive.
func TestFaultCreatedOnBothSides(t *testing.T) {
	requireCLI(t)
	orig := newOrig(t, map[string]string{"a.txt": "a\n"})
	sb := mountSandbox(t, orig)
	require.NoError(t, os.WriteFile(sb.path("new.txt"), []byte("sandbox\n"), 0o644))
	require.NoError(t, os.Mkdir(sb.path("newdir"), 0o755))
	require.NoError(t, os.WriteFile(sb.path("newdir/f"), []byte("sandbox f\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(orig, "new.txt"), []byte("outside\n"), 0o644))
	outside := mustWalk(t, orig, snapshotOpts)

	r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	t.Logf("%s", r)
	assertCleanCLIError(t, r, exitConflictCode)
	assert.Contains(t, r.stderr, "new.txt: created in the original too")
	assertSameTree(t, outside, mustWalk(t, orig, snapshotOpts), "the original after the commit (the outside new.txt must survive)")
	if r.code == 0 {
		t.Errorf("the commit replaced the original's new.txt (%q) by the sandbox's without a conflict", mustRead(t, filepath.Join(orig, "new.txt")))
	}
}

// chattr sets or clears a file attribute (+i, -i) with chattr(1),
// skipping where the file system has none; +i is undone when the test
// ends.
func chattr(t *testing.T, flag, p string) {
	t.Helper()
	out, err := runTimeout(10*time.Second, "chattr", flag, p)
	if err != nil {
		if strings.HasPrefix(flag, "+") {
			t.Skipf("chattr %s is not supported here: %v %s", flag, err, out)
		}
		t.Fatalf("chattr %s %s: %v %s", flag, p, err, out)
	}
	if strings.HasPrefix(flag, "+") {
		t.Cleanup(func() { _, _ = runTimeout(10*time.Second, "chattr", "-"+flag[1:], p) })
	}
}

// TestFaultCommitRefusedByOriginal: the original cannot take the commit.
// Every case ends with a clear error, the original unchanged, the
// sandbox's changes kept, and a retry that succeeds once the cause is
// fixed.
func TestFaultCommitRefusedByOriginal(t *testing.T) {
	requireCLI(t)
	if os.Geteuid() != 0 {
		t.Skip("chattr and tmpfs need root")
	}

	t.Run("immutable directory", func(t *testing.T) {
		orig := newOrig(t, map[string]string{"locked/f": "f\n", "locked/sub/g": "g\n", "free/h": "h\n", "top.txt": "top\n"})
		sb := mountSandbox(t, orig, allowServerErrors())
		require.NoError(t, os.WriteFile(sb.path("top.txt"), []byte("top changed\n"), 0o644))
		require.NoError(t, os.WriteFile(sb.path("free/h"), []byte("h changed\n"), 0o644))
		require.NoError(t, os.WriteFile(sb.path("free/new"), []byte("new\n"), 0o644))
		require.NoError(t, os.WriteFile(sb.path("locked/f"), []byte("f changed\n"), 0o644))
		require.NoError(t, os.WriteFile(sb.path("locked/new"), []byte("new\n"), 0o644))
		require.NoError(t, os.Remove(sb.path("locked/sub/g")))
		view := mustWalk(t, sb.mnt, viewOpts)
		// A read-only (0555) directory stops nobody as root: the immutable
		// attribute stands for it.
		require.NoError(t, os.Chmod(filepath.Join(orig, "locked"), 0o555))
		chattr(t, "+i", filepath.Join(orig, "locked"))
		before := mustWalk(t, orig, unchangedOpts)

		r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
		assertCleanCLIError(t, r, exitCommitFailedCode)
		assert.Contains(t, r.stderr, "locked", "the error names the directory")
		assert.Contains(t, r.stderr, "operation not permitted")
		assert.Contains(t, r.stderr, "the original is unchanged")
		assertSameTree(t, before, mustWalk(t, orig, unchangedOpts), "the original after the failed commit")
		assertSameTree(t, view, mustWalk(t, sb.mnt, viewOpts), "the sandbox after the failed commit")
		_, err := os.Stat(filepath.Join(sb.work, "commit.json"))
		assert.ErrorIs(t, err, os.ErrNotExist, "no undo log is left")

		chattr(t, "-i", filepath.Join(orig, "locked"))
		r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
		require.Equal(t, 0, r.code, "retry once the directory is mutable: %s", r)
		got := mustWalk(t, orig, viewOpts)
		delete(view, "locked") // its mode was changed outside
		assert.Equal(t, uint32(0o555), got["locked"].Perm)
		delete(got, "locked")
		assertSameTree(t, view, got, "the original after the retried commit")
	})

	t.Run("file replaced by a directory", func(t *testing.T) {
		orig := newOrig(t, map[string]string{"mod.txt": "m\n", "keep.txt": "k\n"})
		sb := mountSandbox(t, orig)
		require.NoError(t, os.WriteFile(sb.path("x"), []byte("sandbox x\n"), 0o644))
		require.NoError(t, os.WriteFile(sb.path("mod.txt"), []byte("sandbox m\n"), 0o644))
		require.NoError(t, os.WriteFile(sb.path("other"), []byte("other\n"), 0o644))
		view := mustWalk(t, sb.mnt, viewOpts)
		// Outside, a directory (with content) takes the name the sandbox
		// created a file at, and one it modified.
		writeTree(t, orig, map[string]string{"x/inside": "outside data"})
		require.NoError(t, os.Remove(filepath.Join(orig, "mod.txt")))
		writeTree(t, orig, map[string]string{"mod.txt/inside": "outside data"})
		before := mustWalk(t, orig, unchangedOpts)

		r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
		assertCleanCLIError(t, r, exitConflictCode)
		assert.Contains(t, r.stderr, "x: created in the original too")
		assert.Contains(t, r.stderr, "mod.txt: replaced in the original")
		assertSameTree(t, before, mustWalk(t, orig, unchangedOpts), "the original after the refused commit")
		assertSameTree(t, view, mustWalk(t, sb.mnt, viewOpts), "the sandbox after the refused commit")

		// The user moves the outside directories away. x no longer
		// conflicts; mod.txt still does (the object the sandbox changed
		// is gone), so the user forces the commit.
		for _, p := range []string{"x", "mod.txt"} {
			require.NoError(t, os.Rename(filepath.Join(orig, p), filepath.Join(orig, p+".outside")))
		}
		r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
		assertCleanCLIError(t, r, exitConflictCode)
		assert.NotContains(t, r.stderr, "x: created")
		assert.Contains(t, r.stderr, "mod.txt: removed from the original")
		r = sbxfsCLI(t, cliTimeout, "commit", "--force", sb.mnt)
		require.Equal(t, 0, r.code, "commit --force: %s", r)
		got := mustWalk(t, orig, viewOpts)
		for _, p := range []string{"x", "mod.txt"} {
			assert.Equal(t, "outside data", mustRead(t, filepath.Join(orig, p+".outside/inside")), "the outside directory moved aside is kept")
			delete(got, p+".outside")
			delete(got, p+".outside/inside")
		}
		root := got[""]
		root.Entries = slices.DeleteFunc(root.Entries, func(s string) bool { return strings.HasSuffix(s, ".outside") })
		got[""] = root
		assertSameTree(t, view, got, "the original after the forced commit")
	})

	t.Run("stale mount", func(t *testing.T) {
		for _, how := range []string{"commit the dead mount", "unmount then commit the directory"} {
			t.Run(how, func(t *testing.T) {
				orig := newOrig(t, map[string]string{"a": "a\n", "d/b": "b\n"})
				sb := mountSandbox(t, orig, allowServerErrors())
				require.NoError(t, appendFsync(sb.path("a"), []byte("more\n")))
				require.NoError(t, writeFsync(sb.path("d/new"), []byte("new\n"), os.O_EXCL))
				require.NoError(t, os.Remove(sb.path("d/b")))
				view := mustWalk(t, sb.mnt, viewOpts)
				sb.kill(t)
				r := sbxfsCLI(t, cliTimeout, "status", sb.mnt)
				assert.Equal(t, 0, r.code, "status of a dead mount: %s", r)
				target := sb.mnt
				if how != "commit the dead mount" {
					unmountStale(t, sb)
					target = sb.state
				}
				r = sbxfsCLI(t, cliTimeout, "commit", target)
				require.Equal(t, 0, r.code, "commit: %s", r)
				assertSameTree(t, view, mustWalk(t, orig, viewOpts), "the original after committing a killed sandbox")
				_, mounted := mountAt(sb.mnt)
				assert.False(t, mounted, "the dead mount is gone after the commit")
				r = sbxfsCLI(t, cliTimeout, "unmount", sb.mnt)
				assertCleanCLIError(t, r, exitNotSbxfsCode)
			})
		}
	})

	t.Run("original full", func(t *testing.T) {
		small := tmpfsDir(t, "4m")
		orig := filepath.Join(small, "orig")
		writeTree(t, orig, map[string]string{"keep.txt": "keep\n", "d/mod.txt": "mod\n", "d/gone.txt": "gone\n"})
		// Fill most of it outside.
		require.NoError(t, os.WriteFile(filepath.Join(orig, "ballast"), patterned("ballast", 3<<20), 0o644))
		sb := mountSandbox(t, orig, allowServerErrors())
		require.NoError(t, os.WriteFile(sb.path("d/mod.txt"), []byte("mod changed\n"), 0o644))
		require.NoError(t, os.Remove(sb.path("d/gone.txt")))
		require.NoError(t, os.WriteFile(sb.path("big"), patterned("big", 2<<20), 0o644))
		view := mustWalk(t, sb.mnt, viewOpts)
		before := mustWalk(t, orig, unchangedOpts)

		r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
		assertCleanCLIError(t, r, exitCommitFailedCode)
		assert.Contains(t, r.stderr, "no space left on device")
		assertSameTree(t, before, mustWalk(t, orig, unchangedOpts), "the original after the failed commit")
		assertSameTree(t, view, mustWalk(t, sb.mnt, viewOpts), "the sandbox after the failed commit")

		resizeTmpfs(t, small, "16m")
		r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
		require.Equal(t, 0, r.code, "retry with room: %s", r)
		assertSameTree(t, view, mustWalk(t, orig, viewOpts), "the original after the retried commit")
	})
}
