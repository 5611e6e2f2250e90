package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// holdACopy starts a process in a mount namespace of its own, with
// private propagation (as unshare -m makes it): it holds a copy of every
// mount there is now, which an unmount here does not reach. It returns the
// path through which that namespace's view of the file system is seen.
func holdACopy(t *testing.T) string {
	t.Helper()
	other, _ := holdACopyFrom(t, "")
	return other
}

// holdACopyFrom is holdACopy with the process's working directory at dir
// in its namespace ("": the test's); stop ends the process.
func holdACopyFrom(t *testing.T, dir string) (other string, stop func()) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	// Go makes / rprivate in the new namespace, then enters dir there.
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	require.NoError(t, cmd.Start())
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	t.Cleanup(stop)
	return fmt.Sprintf("/proc/%d/root", cmd.Process.Pid), stop
}

// assertCutOff checks that the copy of a mount seen at p answers ENOTCONN
// (statfs(2) always asks the server; a stat may come from the kernel's
// cache).
func assertCutOff(t *testing.T, p string) {
	t.Helper()
	var st unix.Statfs_t
	assert.ErrorIs(t, unix.Statfs(p, &st), syscall.ENOTCONN, "the copy is cut off")
}

// TestACopyOfTheMountElsewhere: a copy of a sandbox's mount in another
// mount namespace (unshare -m while it is mounted) or a bind mount of it
// outlives the unmount of the mountpoint and would keep its server
// serving: the commit waited for the server, said the mount was busy and
// failed to reset the sandbox (exit 1), the daemon waited 10 s a commit.
// Now the unmount cuts the copy off (it answers ENOTCONN), the server
// finishes, and commit, unmount and mount again work as without it. Not
// parallel: the namespace holds a copy of every mount there is.
func TestACopyOfTheMountElsewhere(t *testing.T) {
	requireFuse(t)
	if os.Geteuid() != 0 {
		t.Skip("a mount namespace needs root")
	}
	t.Run("commit", func(t *testing.T) {
		bin, f := mountedFixture(t)
		writeFile(t, filepath.Join(f.mnt, "a.txt"), "mine\n")
		other := holdACopy(t)
		assertFile(t, other+f.mnt+"/a.txt", "mine\n") // the copy shows the sandbox
		r := runBin(t, bin, "commit", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Empty(t, r.stderr)
		assertFile(t, filepath.Join(f.orig, "a.txt"), "mine\n")
		assert.False(t, isMounted(t, f.mnt))
		assert.NoDirExists(t, f.dir, "the sandbox is removed")
		assertCutOff(t, other+f.mnt)
	})
	t.Run("in use there", func(t *testing.T) {
		// A process working in the copy makes the mount busy, as one
		// working here would: the commit goes through and the mount stays
		// up, empty, for that process.
		bin, f := mountedFixture(t)
		writeFile(t, filepath.Join(f.mnt, "a.txt"), "mine\n")
		other, stop := holdACopyFrom(t, f.mnt)
		r := runBin(t, bin, "rollback", f.mnt)
		assertFailure(t, r, exitBusy, "processes in another mount namespace use it (pid ")
		assert.Contains(t, r.stderr, "nothing was rolled back")
		r = runBin(t, bin, "commit", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stderr, "is busy: it stays mounted over the updated original with an empty sandbox")
		assertFile(t, filepath.Join(f.orig, "a.txt"), "mine\n")
		assert.True(t, isMounted(t, f.mnt))
		assertFile(t, other+f.mnt+"/a.txt", "mine\n") // the copy still answers
		r = runBin(t, bin, "unmount", f.mnt)
		assertFailure(t, r, exitBusy, "processes in another mount namespace use it")
		stop()
		r = runBin(t, bin, "unmount", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
	})
	t.Run("unmount and mount again", func(t *testing.T) {
		bin, f := mountedFixture(t)
		writeFile(t, filepath.Join(f.mnt, "kept"), "kept\n")
		other := holdACopy(t)
		r := runBin(t, bin, "unmount", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stderr, "was still mounted elsewhere (a bind mount, or a copy in another mount namespace): cut off")
		assertCutOff(t, other+f.mnt)
		r = runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assertFile(t, filepath.Join(f.mnt, "kept"), "kept\n")
		r = runBin(t, bin, "rollback", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assert.NoFileExists(t, filepath.Join(f.orig, "kept"))
	})
	t.Run("bind mount", func(t *testing.T) {
		bin, f := mountedFixture(t)
		writeFile(t, filepath.Join(f.mnt, "a.txt"), "mine\n")
		bind := filepath.Join(filepath.Dir(f.mnt), "bind")
		require.NoError(t, os.Mkdir(bind, 0o755))
		require.NoError(t, unix.Mount(f.mnt, bind, "", unix.MS_BIND, ""))
		t.Cleanup(func() { _ = unix.Unmount(bind, unix.MNT_DETACH) })
		r := runBin(t, bin, "commit", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assertFile(t, filepath.Join(f.orig, "a.txt"), "mine\n")
		assertCutOff(t, bind)
	})
	t.Run("managed", func(t *testing.T) {
		e := newManagedEnv(t)
		o := e.original("o")
		sb := e.create(o)
		writeFile(t, filepath.Join(sb.Mountpoint, "a.txt"), "mine\n")
		other := holdACopy(t)
		r := e.sbxfs("unmount", sb.Mountpoint)
		require.Equal(t, 0, r.code, r.stderr)
		assertCutOff(t, other+sb.Mountpoint)
		r = e.sbxfs("mount", sb.ID)
		require.Equal(t, 0, r.code, r.stderr)
		other = holdACopy(t)
		r = e.sbxfs("commit", sb.ID)
		require.Equal(t, 0, r.code, r.stderr)
		assertFile(t, filepath.Join(o, "a.txt"), "mine\n")
		log, err := os.ReadFile(filepath.Join(e.root, "daemon.log"))
		require.NoError(t, err)
		assert.Contains(t, string(log), "cut off, it answers ENOTCONN there")
		assert.NotContains(t, string(log), "has not finished")
	})
}
