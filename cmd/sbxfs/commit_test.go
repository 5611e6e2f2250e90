package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/internal/immutable"
	"github.com/sbxfs/sbxfs/internal/shellwriter"
)

// TestCommitKeepRollbackCycle drives the whole cycle as a user types it:
// work in the mount, a commit refused while a file is open for writing,
// a commit that keeps the mount, more work rolled back, a conflict, and a
// final commit that unmounts and removes the sandbox.
func TestCommitKeepRollbackCycle(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin, f := mountedFixture(t)

	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "a.txt"), []byte("v2\n"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(f.mnt, "sub", "new"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "sub", "new", "f"), []byte("f\n"), 0o600))

	open, err := os.OpenFile(filepath.Join(f.mnt, "a.txt"), os.O_WRONLY, 0)
	require.NoError(t, err)
	r := runBin(t, bin, "commit", f.mnt)
	assertFailure(t, r, exitBusy, "a.txt")
	assertFile(t, filepath.Join(f.orig, "a.txt"), "hello\n")
	require.NoError(t, open.Close())

	r = runBin(t, bin, "commit", "--keep", "-m", "first", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(f.orig, "a.txt"), "v2\n")
	assertFile(t, filepath.Join(f.orig, "sub", "new", "f"), "f\n")
	assert.True(t, isMounted(t, f.mnt), "--keep stays mounted")
	assert.Empty(t, statusOf(t, f.mnt).Changes, "the kept sandbox is empty")
	assertFile(t, filepath.Join(f.mnt, "a.txt"), "v2\n")

	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "a.txt"), []byte("discard me\n"), 0o644))
	r = runBin(t, bin, "rollback", "--keep", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(f.mnt, "a.txt"), "v2\n")

	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "a.txt"), []byte("mine\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "a.txt"), []byte("theirs\n"), 0o644))
	r = runBin(t, bin, "commit", f.mnt)
	assertFailure(t, r, exitConflict, "a.txt")
	assertFile(t, filepath.Join(f.orig, "a.txt"), "theirs\n")

	r = runBin(t, bin, "commit", "--force", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(f.orig, "a.txt"), "mine\n")
	assert.False(t, isMounted(t, f.mnt), "commit unmounts")
	assert.NoDirExists(t, f.dir, "commit removes the sandbox")
}

func assertFile(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, want, string(b), path)
}

// TestCommitGit commits a sandbox over a git work tree with --git: the git
// commit holds exactly the sandbox's paths and the message, and the files
// of a renamed directory at their new paths; an unrelated dirty file stays
// dirty and uncommitted.
func TestCommitGit(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", f.orig}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "unrelated.txt"), []byte("u\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(f.orig, "tracked", "y"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "tracked", "x.txt"), []byte("x\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "tracked", "y", "z.txt"), []byte("z\n"), 0o644))
	git("add", "-A")
	git("commit", "-q", "-m", "base")
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "unrelated.txt"), []byte("dirty\n"), 0o644))

	r := runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "a.txt"), []byte("via sbxfs\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "sub", "n.txt"), []byte("n\n"), 0o644))
	require.NoError(t, os.Rename(filepath.Join(f.mnt, "tracked"), filepath.Join(f.mnt, "moved")))

	r = runBin(t, bin, "commit", "--git", f.mnt)
	assertFailure(t, r, exitUsage, "-m")
	r = runBin(t, bin, "commit", "--git", "-m", "from the sandbox", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "from the sandbox", git("log", "-1", "--format=%s"))
	assert.Equal(t, "M\ta.txt\nR100\ttracked/x.txt\tmoved/x.txt\nR100\ttracked/y/z.txt\tmoved/y/z.txt\nA\tsub/n.txt",
		git("show", "--name-status", "--format=", "HEAD"))
	assert.Equal(t, "M unrelated.txt", git("status", "--porcelain"), "the unrelated dirty file is left alone")
}

// TestCommitOfABusyMount: a shell working in the mount keeps it busy, so
// the commit cannot unmount it. The commit succeeds (exit 0), says so,
// and leaves the mount up over the new original with an empty sandbox;
// the shell's files made after the commit's freeze are in the sandbox,
// none lost, and the next commit takes them without a false conflict.
// (Until 2026-11-26 the failed unmount thawed the mount, the reset then
// failed, exit 1, and the sandbox kept the committed changes: the next
// commit named them as conflicts.)
func TestCommitOfABusyMount(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin, f := mountedFixture(t)
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "a.txt"), []byte("v2\n"), 0o644))
	w := shellwriter.Run(t, f.mnt)

	r := runBin(t, bin, "commit", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stderr, "is busy: it stays mounted over the updated original with an empty sandbox")
	assert.Contains(t, r.stdout, "committed")
	assert.True(t, isMounted(t, f.mnt), "a busy mount stays mounted")
	assertFile(t, filepath.Join(f.orig, "a.txt"), "v2\n")
	for _, c := range statusOf(t, f.mnt).Changes {
		assert.True(t, strings.HasPrefix(c.Path, "n"), "only the writer's later files are in the sandbox, not %s", c.Path)
	}

	require.True(t, w.WaitCreated(len(w.Created())+3, 10*time.Second), "thawed: the shell goes on")
	w.Stop()
	made := w.Created()
	for _, n := range made {
		assertFile(t, filepath.Join(f.mnt, "n"+n), n+"\n")
	}
	r = runBin(t, bin, "commit", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, f.mnt), "no longer busy: unmounted")
	for _, n := range made {
		assertFile(t, filepath.Join(f.orig, "n"+n), n+"\n")
	}
}

// TestRollbackOfABusyMount: a rollback cannot end a mount in use; it
// refuses with exit 4, says what to do, and changes nothing (until
// 2026-11-26: exit 1 with fusermount3's message).
func TestRollbackOfABusyMount(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin, f := mountedFixture(t)
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "a.txt"), []byte("v2\n"), 0o644))
	w := shellwriter.Run(t, f.mnt)

	r := runBin(t, bin, "rollback", f.mnt)
	assertFailure(t, r, exitBusy, "is in use")
	assert.Contains(t, r.stderr, "nothing was rolled back: close what uses it and retry, or use --keep")
	assert.True(t, isMounted(t, f.mnt))
	assertFile(t, filepath.Join(f.mnt, "a.txt"), "v2\n")

	w.Stop()
	r = runBin(t, bin, "rollback", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, f.mnt))
	assertFile(t, filepath.Join(f.orig, "a.txt"), "hello\n")
}

// TestOriginalMovedAway: with the original moved away, status, diff,
// commit and resolve refuse with exit 3 and say to put it back; nothing
// is lost, and once it is back the commit goes through (until 2026-11-26:
// exit 1 and 8, "invalid overlay configuration").
func TestOriginalMovedAway(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin, f := mountedFixture(t)
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "sub", "new"), []byte("n\n"), 0o644))
	away := f.orig + ".away"
	require.NoError(t, os.Rename(f.orig, away))
	for _, cmd := range []string{"status", "diff", "commit", "resolve"} {
		r := runBin(t, bin, cmd, f.mnt)
		assertFailure(t, r, exitBadPath, "the original "+f.orig+" of this sandbox is missing (moved or removed?): put it back there and retry")
	}
	assert.True(t, isMounted(t, f.mnt))
	require.NoError(t, os.Rename(away, f.orig))
	r := runBin(t, bin, "commit", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(f.orig, "sub", "new"), "n\n")
}

// TestCommitAcrossAMountInTheOriginal: a change on a filesystem mounted
// inside the original is refused before anything is applied, exit 3, with
// what to do (until 2026-11-26: EXDEV in the apply, undone, exit 8).
func TestCommitAcrossAMountInTheOriginal(t *testing.T) {
	requireFuse(t)
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)
	sub := filepath.Join(f.orig, "sub")
	require.NoError(t, unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	r := runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "sub", "g"), []byte("g\n"), 0o644))
	r = runBin(t, bin, "commit", f.mnt)
	assertFailure(t, r, exitBadPath, "a change lies on another filesystem mounted inside the original: sub/g")
	assert.Contains(t, r.stderr, "nothing was applied")
	assert.NoFileExists(t, filepath.Join(sub, "g"))
	assert.True(t, isMounted(t, f.mnt))
}

// TestCommitRefusedByTheFileSystem: a commit the original's file system
// refuses (an immutable directory, a read-only mount) fails with exit 8,
// says what to do, changes nothing and keeps the sandbox's changes, and
// the same commit passes once the cause is gone.
func TestCommitRefusedByTheFileSystem(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	t.Run("immutable", func(t *testing.T) {
		t.Parallel()
		bin, f := mountedFixture(t)
		writeFile(t, filepath.Join(f.mnt, "sub", "new"), "new\n")
		writeFile(t, filepath.Join(f.mnt, "a.txt"), "mine\n")
		undo := immutable.Set(t, filepath.Join(f.orig, "sub"))
		r := runBin(t, bin, "commit", f.mnt)
		assertFailure(t, r, exitCommitFailed, "operation not permitted")
		assert.Contains(t, r.stderr, "may be immutable or append-only: 'lsattr -d PATH' shows it")
		assert.Contains(t, r.stderr, "the sandbox keeps its changes")
		assertFile(t, filepath.Join(f.orig, "a.txt"), "hello\n")
		assert.NoFileExists(t, filepath.Join(f.orig, "sub", "new"))
		assert.True(t, isMounted(t, f.mnt))
		assertFile(t, filepath.Join(f.mnt, "sub", "new"), "new\n")

		undo()
		r = runBin(t, bin, "commit", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assertFile(t, filepath.Join(f.orig, "a.txt"), "mine\n")
		assertFile(t, filepath.Join(f.orig, "sub", "new"), "new\n")
	})
	t.Run("read-only", func(t *testing.T) {
		t.Parallel()
		if os.Geteuid() != 0 {
			t.Skip("a read-only bind mount needs root")
		}
		bin := sbxfsBin(t)
		f := newFixture(t)
		ro := filepath.Join(filepath.Dir(f.orig), "ro")
		require.NoError(t, os.Mkdir(ro, 0o755))
		require.NoError(t, unix.Mount(f.orig, ro, "", unix.MS_BIND, ""))
		t.Cleanup(func() { _ = unix.Unmount(ro, unix.MNT_DETACH) })
		require.NoError(t, unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""))
		r := runBin(t, bin, "mount", "--upper", f.dir, ro, f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		writeFile(t, filepath.Join(f.mnt, "a.txt"), "mine\n")

		r = runBin(t, bin, "commit", f.mnt)
		assertFailure(t, r, exitCommitFailed, "read-only file system")
		assert.Contains(t, r.stderr, "nothing was applied; the file system named is mounted read-only: remount it read-write")
		assert.NoFileExists(t, filepath.Join(f.dir, "work", "txn.pending"), "no transaction directory was made")
		assertFile(t, filepath.Join(f.orig, "a.txt"), "hello\n")
		assertFile(t, filepath.Join(f.mnt, "a.txt"), "mine\n")

		require.NoError(t, unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_BIND, ""))
		r = runBin(t, bin, "commit", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assertFile(t, filepath.Join(f.orig, "a.txt"), "mine\n")
	})
}
