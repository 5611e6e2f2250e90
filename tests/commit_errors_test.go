package tests

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// faultyOriginal serves dir through tests/internal/faultyfs (its own
// process) and returns the mountpoint and the server, unmounted at the
// end of the test whatever happens.
func faultyOriginal(t *testing.T, dir string) (string, *exec.Cmd) {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "faulty")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	cmd := exec.Command(faultyBin, dir, mnt)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if !waitDone(done, 10*time.Second) {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
			_ = cmd.Process.Kill()
			<-done
		}
	})
	ready := make(chan bool, 1)
	go func() {
		s := bufio.NewScanner(out)
		ready <- s.Scan() && s.Text() == "ready"
		for s.Scan() {
		}
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "faultyfs did not start")
	case <-time.After(mountTimeout):
		t.Fatal("faultyfs did not start in time")
	}
	return mnt, cmd
}

// An error from the original's filesystem in the middle of a commit (an
// I/O error, a permission refused): the applied part is undone, the error
// names the cause and says the original is unchanged, the sandbox keeps
// its changes, and once the cause is gone the same sandbox commits.
func TestCommitFailureIsUndoneAndRetryable(t *testing.T) {
	for _, c := range []struct{ prefix, message string }{
		{"eio", "input/output error"},
		{"eacces", "permission denied"},
	} {
		t.Run(c.prefix, func(t *testing.T) { commitFailsOn(t, c.prefix, c.message) })
	}
}

func commitFailsOn(t *testing.T, prefix, message string) {
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
	if os.Geteuid() != 0 {
		t.Skip("faultyfs mounts directly: needs root")
	}
	base := t.TempDir()
	for p, v := range map[string]string{"a.txt": "a", prefix + ".txt": "old", "d/keep": "k", "z.txt": "z"} {
		require.NoError(t, os.MkdirAll(filepath.Join(base, filepath.Dir(p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(base, p), []byte(v), 0o644))
	}
	orig, faulty := faultyOriginal(t, base)
	// Moving a file out and back in changes its ctime, nothing else.
	opts := walkOpts{xattr: allXattrs, owner: true, mtime: true, ino: true}
	before, err := walkTree(base, opts)
	require.NoError(t, err)

	sb := mountSandbox(t, orig)
	// Changes on both sides of the failing path in apply order.
	require.NoError(t, os.WriteFile(sb.path("a.txt"), []byte("new a"), 0o644))
	require.NoError(t, os.WriteFile(sb.path(prefix+".txt"), []byte("new eio"), 0o644))
	require.NoError(t, os.Remove(sb.path("z.txt")))
	require.NoError(t, os.WriteFile(sb.path("d/new"), []byte("n"), 0o644))

	out, err := runTimeout(60*time.Second, cliBin, "commit", sb.mnt)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the commit must fail: %s", out)
	assert.Equal(t, 8, ee.ExitCode(), "exit code 8, commit failed: %s", out)
	assert.Contains(t, string(out), message)
	assert.Contains(t, string(out), "the original is unchanged")
	assert.NotContains(t, string(out), "goroutine")

	after, err := walkTree(base, opts)
	require.NoError(t, err)
	assert.Empty(t, diffTrees(before, after, 20), "the original is as before: content, inodes, owners, modes, times, xattrs")
	leftovers, _ := filepath.Glob(filepath.Join(base, ".sbxfs-txn-*"))
	assert.Empty(t, leftovers, "no staging area left in the original")

	got, err := os.ReadFile(sb.path(prefix + ".txt"))
	require.NoError(t, err, "the sandbox is still mounted")
	assert.Equal(t, "new eio", string(got), "the sandbox keeps its changes")
	st, err := runTimeout(20*time.Second, cliBin, "status", sb.mnt)
	require.NoError(t, err, "%s", st)
	for _, p := range []string{"a.txt", prefix + ".txt", "z.txt", "d/new"} {
		assert.Contains(t, string(st), p)
	}

	require.NoError(t, faulty.Process.Signal(syscall.SIGUSR1)) // the cause is gone
	time.Sleep(100 * time.Millisecond)
	out, err = runTimeout(60*time.Second, cliBin, "commit", sb.mnt)
	require.NoError(t, err, "the retry commits: %s", out)
	for p, want := range map[string]string{"a.txt": "new a", prefix + ".txt": "new eio", "d/new": "n", "d/keep": "k"} {
		b, err := os.ReadFile(filepath.Join(base, p))
		require.NoError(t, err, p)
		assert.Equal(t, want, string(b), p)
	}
	_, err = os.Lstat(filepath.Join(base, "z.txt"))
	assert.True(t, os.IsNotExist(err), "z.txt deleted")
	assert.False(t, strings.Contains(string(out), "goroutine"))
}
