package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
)

// requireFuse skips real-mount tests where this process cannot mount.
func requireFuse(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("real-mount tests run as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
}

// isMounted reports whether mnt is a mount point now.
func isMounted(t *testing.T, mnt string) bool {
	t.Helper()
	es, err := fsutil.ReadMountinfo()
	require.NoError(t, err)
	return fsutil.MountAt(es, mnt) != nil
}

// cleanupMount makes sure mnt is unmounted when the test ends, whatever
// happened: sbxfs unmount, then umount -l as a last resort.
func cleanupMount(t *testing.T, mnt string) {
	t.Helper()
	bin := sbxfsBin(t)
	t.Cleanup(func() {
		for _, try := range [][]string{{bin, "unmount", mnt}, {bin, "unmount", "--lazy", mnt}, {"umount", "-l", mnt}} {
			if !isMounted(t, mnt) {
				return
			}
			out, err := exec.Command(try[0], try[1:]...).CombinedOutput()
			t.Logf("cleanup: %q: %v %s", try, err, out)
		}
		if isMounted(t, mnt) {
			t.Errorf("cleanup: %s is still mounted", mnt)
		}
	})
}

// sandboxFixture is an original with a file, an empty mountpoint and a
// sandbox directory path, all resolved.
type sandboxFixture struct {
	orig, mnt, dir string
}

func newFixture(t *testing.T) sandboxFixture {
	t.Helper()
	base := realTempDir(t)
	f := sandboxFixture{orig: filepath.Join(base, "orig"), mnt: filepath.Join(base, "mnt"), dir: filepath.Join(base, "sandbox")}
	require.NoError(t, os.MkdirAll(filepath.Join(f.orig, "sub"), 0o755))
	require.NoError(t, os.Mkdir(f.mnt, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "a.txt"), []byte("hello\n"), 0o644))
	cleanupMount(t, f.mnt)
	return f
}

// mountedFixture mounts a new fixture with 'sbxfs mount --upper' and
// returns the binary and the fixture.
func mountedFixture(t *testing.T) (string, sandboxFixture) {
	t.Helper()
	bin := sbxfsBin(t)
	f := newFixture(t)
	r := runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	return bin, f
}

// statusOf runs sbxfs status --json and decodes it.
func statusOf(t *testing.T, arg string) statusJSON {
	t.Helper()
	r := runBin(t, sbxfsBin(t), "status", "--json", arg)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	return st
}

func hasChange(st statusJSON, path, kind string) bool {
	for _, c := range st.Changes {
		if c.Path == path && c.Kind == kind {
			return true
		}
	}
	return false
}

func TestMountWriteStatusUnmount(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)

	r := runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, isMounted(t, f.mnt), "mounted when sbxfs mount returns")

	b, err := os.ReadFile(filepath.Join(f.mnt, "a.txt"))
	require.NoError(t, err)
	assert.Equal(t, "hello\n", string(b))
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "new.txt"), []byte("new\n"), 0o640))

	assert.NoFileExists(t, filepath.Join(f.orig, "new.txt"), "the original is unchanged")
	b, err = os.ReadFile(filepath.Join(f.orig, "a.txt"))
	require.NoError(t, err)
	assert.Equal(t, "hello\n", string(b))
	b, err = os.ReadFile(filepath.Join(f.dir, "upper", "new.txt"))
	require.NoError(t, err, "the new file is in the upper layer")
	assert.Equal(t, "new\n", string(b))

	st := statusOf(t, f.mnt)
	assert.True(t, st.Mounted)
	assert.Equal(t, f.mnt, st.Mountpoint)
	assert.Equal(t, f.orig, st.Original)
	assert.Equal(t, filepath.Join(f.dir, "upper"), st.Upper)
	assert.True(t, hasChange(st, "new.txt", "created"), "status lists the new file: %+v", st.Changes)
	r = runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "A new.txt\n")

	// A large new directory is one line, unless --all; --json lists
	// every entry.
	tree := filepath.Join(f.mnt, "node_modules")
	for i := range 120 {
		require.NoError(t, os.MkdirAll(filepath.Join(tree, fmt.Sprintf("p%d", i%3)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(tree, fmt.Sprintf("p%d", i%3), fmt.Sprint(i)), nil, 0o644))
	}
	r = runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code)
	assert.Equal(t, "A new.txt\nA node_modules/ (123 entries)\n125 changes: 125 created\n", r.stdout)
	r = runBin(t, bin, "status", "--all", f.mnt)
	require.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "A node_modules/p2/119\n")
	assert.Equal(t, 126, strings.Count(r.stdout, "\n"))
	assert.True(t, hasChange(statusOf(t, f.mnt), "node_modules/p2/119", "created"))
	require.NoError(t, os.RemoveAll(tree))

	// Without an argument, status and diff work on the mount the working
	// directory lies in, as git on its repository; a path inside a mount
	// is refused with the mountpoint named.
	sub := filepath.Join(f.mnt, "sub")
	require.NoError(t, os.MkdirAll(sub, 0o755))
	for _, args := range [][]string{{"status"}, {"diff", "--name-status"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = sub
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
		assert.Regexp(t, `(?m)^A\s+new\.txt$`, string(out), "%v from a subdirectory of the mount", args)
	}
	assertFailure(t, runBin(t, bin, "status", sub), exitNotSbxfs, sub+" lies inside the sbxfs mount "+f.mnt+"; give that mountpoint")
	cmd := exec.Command(bin, "status")
	cmd.Dir = f.orig
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, exitUsage, ee.ExitCode())
	assert.Contains(t, string(out), "status needs MOUNTPOINT|DIR|ID: the working directory "+f.orig+" is not in an sbxfs mount")

	r = runBin(t, bin, "unmount", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, f.mnt))
	assert.NoFileExists(t, filepath.Join(f.dir, "work", pidFileName), "the server has exited")

	st = statusOf(t, f.dir)
	assert.False(t, st.Mounted)
	assert.True(t, hasChange(st, "new.txt", "created"), "the change outlives the mount")

	// A remount of the same sandbox shows the same changes.
	r = runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	b, err = os.ReadFile(filepath.Join(f.mnt, "new.txt"))
	require.NoError(t, err)
	assert.Equal(t, "new\n", string(b))
	other := filepath.Join(filepath.Dir(f.mnt), "other")
	require.NoError(t, os.Mkdir(other, 0o755))
	r = runBin(t, bin, "mount", "--upper", filepath.Join(other, "sb"), f.orig, filepath.Join(f.orig, "sub"))
	assertFailure(t, r, exitBadPath, "is inside the original")
	r = runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	assertFailure(t, r, exitBusy, "already an sbxfs mount")
	require.Equal(t, 0, runBin(t, bin, "unmount", f.mnt).code)

	r = runBin(t, bin, "mount", "--upper", f.dir, other, f.mnt)
	assertFailure(t, r, exitBadPath, "upper belongs to another original")
}

func TestMountStateRootAndForeground(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)
	state := filepath.Join(filepath.Dir(f.dir), "state")

	r := runBin(t, bin, "--state-dir", state, "mount", f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	dir := strings.TrimSpace(strings.TrimPrefix(r.stdout, "upper: "))
	assert.Regexp(t, "^"+state+`/mounts/[0-9a-f]{16}$`, dir)
	st := statusOf(t, dir)
	assert.Equal(t, f.mnt, st.Mountpoint)
	require.Equal(t, 0, runBin(t, bin, "unmount", f.mnt).code)

	// --foreground serves in the process it starts; SIGTERM unmounts.
	cmd := exec.Command(bin, "mount", "--foreground", "--upper", dir, f.orig, f.mnt)
	out, err := os.Create(filepath.Join(filepath.Dir(f.dir), "fg.log"))
	require.NoError(t, err)
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return isMounted(t, f.mnt) }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
	assert.False(t, isMounted(t, f.mnt))
}

func TestUnmountBusyLazyAndStale(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)
	require.Equal(t, 0, runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt).code)

	open, err := os.Open(filepath.Join(f.mnt, "a.txt"))
	require.NoError(t, err)
	r := runBin(t, bin, "unmount", f.mnt)
	assertFailure(t, r, exitBusy, "mount is busy: close the files open under "+f.mnt+", or use --lazy")
	assert.True(t, isMounted(t, f.mnt))
	r = runBin(t, bin, "unmount", "--lazy", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, f.mnt), "detached")
	b := make([]byte, 5)
	_, err = open.Read(b)
	assert.NoError(t, err, "an open file still works after a lazy unmount")
	require.NoError(t, open.Close())
	assert.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(f.dir, "work", pidFileName))
		return os.IsNotExist(err)
	}, 10*time.Second, 20*time.Millisecond, "the server exits once the last file is closed")

	// A mount whose server was killed is stale. Another sandbox cannot
	// mount over it; this one mounts again in its place (as the daemon
	// does), and a commit or an unmount ends it.
	require.Equal(t, 0, runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt).code)
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "a.txt"), []byte("kept\n"), 0o644))
	killServer(t, f.dir, f.mnt)
	r = runBin(t, bin, "mount", "--upper", filepath.Join(filepath.Dir(f.dir), "other"), f.orig, f.mnt)
	assertFailure(t, r, exitBusy, "is already an sbxfs mount")
	st := statusOf(t, f.mnt)
	assert.True(t, st.Mounted)
	r = runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stderr, "detached "+f.mnt+", a mount of this sandbox whose server was gone")
	assertFile(t, filepath.Join(f.mnt, "a.txt"), "kept\n")

	killServer(t, f.dir, f.mnt)
	r = runBin(t, bin, "commit", "--keep", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(f.orig, "a.txt"), "kept\n")
	r = runBin(t, bin, "unmount", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, f.mnt))
}

// killServer kills the process serving the sandbox dir with SIGKILL and
// waits until its mount at mnt is stale.
func killServer(t *testing.T, dir, mnt string) {
	t.Helper()
	pidb, err := os.ReadFile(filepath.Join(dir, "work", pidFileName))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidb)))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return fsutil.IsStaleMount(mnt) }, 10*time.Second, 10*time.Millisecond, "a killed server leaves a stale mount")
}

// helperFixture is a mount helper layout with two lower layers.
func helperFixture(t *testing.T) (lower1, lower2, upper, work, mnt string) {
	t.Helper()
	base := realTempDir(t)
	lower1, lower2 = filepath.Join(base, "l1"), filepath.Join(base, "l2")
	upper, work, mnt = filepath.Join(base, "u"), filepath.Join(base, "w"), filepath.Join(base, "mnt")
	for _, d := range []string{lower1, lower2, upper, work, mnt} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(lower1, "f"), []byte("top\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(lower2, "f"), []byte("hidden\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(lower2, "g"), []byte("bottom\n"), 0o644))
	cleanupMount(t, mnt)
	return
}

// checkHelperMount checks a mount of helperFixture's layers.
func checkHelperMount(t *testing.T, lower1, lower2, upper, mnt string) {
	t.Helper()
	require.True(t, isMounted(t, mnt))
	for name, want := range map[string]string{"f": "top\n", "g": "bottom\n"} {
		b, err := os.ReadFile(filepath.Join(mnt, name))
		require.NoError(t, err)
		assert.Equal(t, want, string(b), name)
	}
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "g"), []byte("changed\n"), 0o644))
	b, err := os.ReadFile(filepath.Join(lower2, "g"))
	require.NoError(t, err)
	assert.Equal(t, "bottom\n", string(b), "lower layers are unchanged")
	assert.FileExists(t, filepath.Join(upper, "g"))
	st := statusOf(t, mnt)
	assert.Equal(t, []string{lower1, lower2}, st.Lowers)
	assert.True(t, hasChange(st, "g", "modified"), "%+v", st.Changes)
}

func TestHelperFormByName(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	l1, l2, upper, work, mnt := helperFixture(t)
	helper := filepath.Join(filepath.Dir(mnt), "mount.fuse.sbxfs")
	require.NoError(t, os.Symlink(sbxfsBin(t), helper))
	opts := fmt.Sprintf("rw,noatime,nofail,x-systemd.automount,lowerdir=%s:%s,upperdir=%s,workdir=%s", l1, l2, upper, work)
	r := runBin(t, helper, "sbxfs", mnt, "-n", "-o", opts)
	require.Equal(t, 0, r.code, r.stderr)
	checkHelperMount(t, l1, l2, upper, mnt)
	es, err := fsutil.ReadMountinfo()
	require.NoError(t, err)
	e := fsutil.MountAt(es, mnt)
	require.NotNil(t, e)
	assert.Equal(t, work, e.Source)
	assert.Contains(t, e.SuperOpts, "allow_other", "root mounts allow other users")
	require.Equal(t, 0, runBin(t, sbxfsBin(t), "unmount", mnt).code)
}

func TestHelperFormMount8(t *testing.T) {
	requireFuse(t)
	if _, err := os.Stat("/sbin/mount.fuse.sbxfs"); err != nil {
		t.Skip("/sbin/mount.fuse.sbxfs is not installed (scripts/install.sh installs it)")
	}
	t.Parallel()
	l1, l2, upper, work, mnt := helperFixture(t)
	opts := fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s", l1, l2, upper, work)
	out, err := exec.Command("mount", "-t", "fuse.sbxfs", "sbxfs", mnt, "-o", opts).CombinedOutput()
	require.NoError(t, err, "mount: %s", out)
	checkHelperMount(t, l1, l2, upper, mnt)
	out, err = exec.Command("umount", mnt).CombinedOutput()
	require.NoError(t, err, "umount: %s", out)
	assert.False(t, isMounted(t, mnt))
}

// TestHelperFormFstab mounts from an fstab line (mount --fstab FILE MNT
// reads it as /etc/fstab would be read).
func TestHelperFormFstab(t *testing.T) {
	requireFuse(t)
	if _, err := os.Stat("/sbin/mount.fuse.sbxfs"); err != nil {
		t.Skip("/sbin/mount.fuse.sbxfs is not installed (scripts/install.sh installs it)")
	}
	t.Parallel()
	l1, l2, upper, work, mnt := helperFixture(t)
	fstab := filepath.Join(t.TempDir(), "fstab")
	line := fmt.Sprintf("sbxfs %s fuse.sbxfs lowerdir=%s:%s,upperdir=%s,workdir=%s,noauto,nofail,x-comment=test 0 0\n", mnt, l1, l2, upper, work)
	require.NoError(t, os.WriteFile(fstab, []byte(line), 0o644))
	out, err := exec.Command("mount", "--fstab", fstab, mnt).CombinedOutput()
	require.NoError(t, err, "mount: %s", out)
	checkHelperMount(t, l1, l2, upper, mnt)
	out, err = exec.Command("umount", mnt).CombinedOutput()
	require.NoError(t, err, "umount: %s", out)
	assert.False(t, isMounted(t, mnt))
}

func TestMountJSON(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)

	r := runBin(t, bin, "mount", "--json", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	var got mountResult
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got), r.stdout)
	assert.Equal(t, mountResult{Mountpoint: f.mnt, Original: f.orig, Sandbox: f.dir,
		Upper: filepath.Join(f.dir, "upper"), Work: filepath.Join(f.dir, "work")}, got)
	assert.True(t, isMounted(t, f.mnt), "mounted when sbxfs mount --json returns")
	require.Equal(t, 0, runBin(t, bin, "unmount", f.mnt).code)
}

// TestStatusNamesRemovalsByOriginalPath: after mv d e; rm -r e in a
// mounted sandbox, status lists the original's d and its files as
// removed, never the paths e/... the original never had.
func TestStatusNamesRemovalsByOriginalPath(t *testing.T) {
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "sub", "f"), []byte("f\n"), 0o644))
	for _, name := range []string{"x", "y"} {
		require.NoError(t, os.WriteFile(filepath.Join(f.orig, name), []byte(name+"\n"), 0o644))
	}
	r := runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, os.Rename(filepath.Join(f.mnt, "sub"), filepath.Join(f.mnt, "moved")))
	require.NoError(t, os.RemoveAll(filepath.Join(f.mnt, "moved")))
	// y's object replaces x's, then goes: both original files are gone.
	require.NoError(t, os.Rename(filepath.Join(f.mnt, "y"), filepath.Join(f.mnt, "x")))
	require.NoError(t, os.Remove(filepath.Join(f.mnt, "x")))

	r = runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "D sub\nD sub/f\nD x\nD y\n4 changes: 4 deleted\n", r.stdout)
	st := statusOf(t, f.mnt)
	require.Len(t, st.Changes, 4, "%+v", st.Changes)
	assert.Equal(t, "sub/f", st.Changes[1].Path)
	r = runBin(t, bin, "diff", "--name-status", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "D\tsub\nD\tsub/f\nD\tx\nD\ty\n", r.stdout)
	r = runBin(t, bin, "diff", "--stat", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, " sub/f | 1 -\n x     | 1 -\n y     | 1 -\n 3 files changed, 3 deletions(-)\n", r.stdout)
	require.Equal(t, 0, runBin(t, bin, "unmount", f.mnt).code)
}
