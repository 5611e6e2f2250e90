package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/manager"
)

// TestManagedRunInPlace: 'sbxfs run --in-place' shows the sandbox to CMD
// at ORIGINAL's own path, and nowhere else: what CMD records of its paths
// (its working directory, a virtual environment's scripts) names ORIGINAL
// and holds after the commit, while the rest of the machine sees ORIGINAL
// unchanged until then. Not parallel: CMD's namespace holds a copy of
// every mount there is.
func TestManagedRunInPlace(t *testing.T) {
	e := newManagedEnv(t)
	o := e.original("o")
	require.NoError(t, os.Mkdir(filepath.Join(o, "sub"), 0o755))

	// From sub, CMD starts in sub at its own path; the process that ran
	// 'sbxfs run' (outside the namespace) does not see the change.
	script := `pwd; echo "$PWD" > where; cat ../a.txt; echo new > ../b.txt
test ! -e "/proc/$PPID/root$1/b.txt" && echo host-unchanged
awk -v p="$1" '$5 == p' /proc/self/mountinfo | wc -l`
	cmd := exec.Command(e.bin, "--state-dir", e.root, "run", "--in-place", "--commit-on-success", "--json", o, "--", "sh", "-c", script, "sh", o)
	cmd.Dir = filepath.Join(o, "sub")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	lines := strings.Split(stdout.String(), "\n")
	require.GreaterOrEqual(t, len(lines), 4, stdout.String())
	assert.Equal(t, filepath.Join(o, "sub"), lines[0], "CMD works at the original's path")
	assert.Equal(t, "hello", lines[1], "and sees the original's files there")
	assert.Equal(t, "host-unchanged", lines[2], "the machine outside CMD's namespace sees the original")
	assert.Equal(t, "1", lines[3], "one mount at the original's path in CMD's namespace: the sandbox")
	var out runJSON
	require.NoError(t, json.Unmarshal([]byte(strings.Join(lines[4:], "\n")), &out), stdout.String())
	assert.True(t, out.Committed)
	assert.Empty(t, out.LeftBehind)
	assertFile(t, filepath.Join(o, "sub", "where"), filepath.Join(o, "sub")+"\n")
	assertFile(t, filepath.Join(o, "b.txt"), "new\n")
	assert.False(t, isMounted(t, o), "the bind never reached this namespace")

	t.Run("venv", func(t *testing.T) {
		if err := exec.Command("python3", "-m", "venv", "--without-pip", filepath.Join(t.TempDir(), "v")).Run(); err != nil {
			t.Skipf("python3 -m venv does not work here: %v", err)
		}
		r := e.sbxfs("run", "--in-place", "--commit-on-success", o, "--", "python3", "-m", "venv", "--without-pip", "venv")
		require.Equal(t, 0, r.code, r.stderr)
		activate, err := os.ReadFile(filepath.Join(o, "venv", "bin", "activate"))
		require.NoError(t, err)
		assert.Contains(t, string(activate), filepath.Join(o, "venv"), "the committed venv names where it lies")
		got, err := exec.Command(filepath.Join(o, "venv", "bin", "python"), "-c", "import sys; print(sys.prefix)").Output()
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(o, "venv"), strings.TrimSpace(string(got)), "and works there")
	})

	t.Run("left behind", func(t *testing.T) {
		// A process CMD leaves in its namespace uses the sandbox through
		// a copy of the mount: the commit keeps the sandbox mounted
		// rather than cut it off.
		pidFile := filepath.Join(e.base, "pid")
		r := e.sbxfs("run", "--in-place", "--commit-on-success", "--json", o, "--",
			"sh", "-c", "echo hi > f; sleep 60 </dev/null >/dev/null 2>&1 & echo $! > "+pidFile)
		var pid int
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		t.Cleanup(func() {
			if pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
		require.Equal(t, 0, r.code, r.stderr)
		assertFile(t, filepath.Join(o, "f"), "hi\n")
		assert.Contains(t, r.stderr, "committed, but something CMD started still runs in its namespace (pid "+strconv.Itoa(pid)+")")
		var out runJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		assert.Equal(t, []int{pid}, out.LeftBehind)
		sb := e.list()[out.ID]
		assert.Equal(t, manager.Active, sb.State)
		assert.True(t, sb.Mounted, "it stays mounted")
		_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "cwd", "f"))
		assert.NoError(t, err, "what is left behind still works in the (reset) sandbox")
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		r = e.sbxfs("destroy", out.ID)
		require.Equal(t, 0, r.code, r.stderr)
	})

	t.Run("commit from inside", func(t *testing.T) {
		// CMD commits its own sandbox: CMD works in it (in its copy of
		// the mount), so the sandbox stays mounted, empty, and CMD goes on.
		script := `echo x > x.txt; "$1" --state-dir "$2" commit "$SBXFS_SANDBOX" || exit 1
cat x.txt && echo y > y.txt`
		r := e.sbxfs("run", "--in-place", "--commit-on-success", o, "--", "sh", "-c", script, "sh", e.bin, e.root)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, "^committed [0-9a-f]{16}\nx\n$", r.stdout, "CMD goes on after its commit")
		assertFile(t, filepath.Join(o, "x.txt"), "x\n")
		assertFile(t, filepath.Join(o, "y.txt"), "y\n")
	})

	t.Run("status and diff from inside", func(t *testing.T) {
		// In CMD's namespace the sandbox covers the original's path:
		// status, diff and resolve read the original where run shows
		// it, read-only. Read at its path they found no change at all.
		script := `echo mine > a.txt; echo new > n.txt
echo theirs > "/proc/$PPID/root$1/a.txt"
"$2" --state-dir "$3" status "$SBXFS_SANDBOX" && "$2" --state-dir "$3" status .
"$2" --state-dir "$3" diff --stat .
"$2" --state-dir "$3" resolve . a.txt > /dev/null && "$2" --state-dir "$3" status --json . | grep -c '"conflicts": \[\]'
view="$3/sandboxes/$SBXFS_SANDBOX/` + manager.InPlaceView + `"
cat "$view/a.txt"; rm "$view/a.txt" 2>/dev/null || echo view-read-only`
		r := e.sbxfs("run", "--in-place", "--json", o, "--", "sh", "-c", script, "sh", o, e.bin, e.root)
		require.Equal(t, 0, r.code, r.stderr)
		status := "M a.txt\nA n.txt\n2 changes: 1 created, 1 modified\n" +
			"1 conflict: a commit refuses it until 'sbxfs resolve . PATH' keeps the sandbox's version (or 'sbxfs commit --force')\n" +
			"  a.txt: content changed in the original\n"
		want := strings.Replace(status, "resolve .", "resolve ID", 1) + status +
			" a.txt | 2 +-\n n.txt | 1 +\n 2 files changed, 2 insertions(+), 1 deletion(-)\n" +
			"1\ntheirs\nview-read-only\n"
		out := r.stdout[:strings.LastIndex(r.stdout, "{")]
		var res runJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout[len(out):]), &res), r.stdout)
		assert.Equal(t, strings.Replace(want, "ID", res.ID, 1), out)
		assertFile(t, filepath.Join(o, "a.txt"), "theirs\n")
		assert.NoDirExists(t, filepath.Join(e.root, "sandboxes", res.ID, manager.InPlaceView), "destroy removes the view's directory")
	})

	t.Run("PWD", func(t *testing.T) {
		// No shell between: CMD's environment says where it starts.
		r := e.sbxfs("run", "--in-place", o, "--", "env")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, strings.Split(r.stdout, "\n"), "PWD="+o)
	})

	t.Run("not found", func(t *testing.T) {
		r := e.sbxfs("run", "--in-place", o, "--", "no-such-command-sbxfs")
		assert.Equal(t, 127, r.code, r.stderr)
		assert.Contains(t, r.stderr, "no-such-command-sbxfs")
	})
}

// TestManagedRunInPlaceNested: a sandbox made inside 'sbxfs run
// --in-place' from a path CMD sees (the original's) is a sandbox of the
// sandbox CMD works in, not of the original: its commit lands in CMD's
// sandbox, and the original changes only when that one is committed (it
// went straight to the original, past the sandbox CMD worked in). The
// daemon's mount of it reaches CMD's namespace where the machine's mounts
// propagate (shared, as systemd makes them: emulated here by a shared
// STATE/mnt); where they do not, run says so and runs nothing.
func TestManagedRunInPlaceNested(t *testing.T) {
	inner := `"$1" --state-dir "$2" run --commit-on-success . -- sh -c 'echo inner > inner.txt' || exit 1
cat inner.txt
test ! -e "/proc/$PPID/root$PWD/inner.txt" && echo original-unchanged
grep -c " $PWD " "/proc/$PPID/mountinfo"
"$1" --state-dir "$2" create --json . > "$3" || exit 1
"$1" --state-dir "$2" destroy "$(sed -n 's/.*"id": "\(.*\)".*/\1/p' "$3")" > /dev/null || exit 1`
	t.Run("shared", func(t *testing.T) {
		e := newManagedEnv(t)
		// The test's directory a shared mount, as a systemd machine's
		// are: the daemon's mounts in STATE/mnt reach CMD, and the bind
		// over o would reach this namespace if CMD's were not slaves.
		require.NoError(t, unix.Mount(e.base, e.base, "", unix.MS_BIND, ""))
		t.Cleanup(func() { // before the env's cleanup, which wants nothing mounted in it
			e.kill(syscall.SIGTERM)
			_ = unix.Unmount(e.base, unix.MNT_DETACH)
		})
		require.NoError(t, unix.Mount("", e.base, "", unix.MS_SHARED, ""))
		o := e.original("o")
		created := filepath.Join(e.base, "created.json")
		r := e.sbxfs("run", "--in-place", "--commit-on-success", "--json", o, "--", "sh", "-c", inner, "sh", e.bin, e.root, created)
		require.Equal(t, 0, r.code, r.stderr)
		lines := strings.SplitN(r.stdout, "\n", 4)
		require.Len(t, lines, 4, r.stdout)
		assert.Equal(t, "inner", lines[0], "CMD sees what the inner sandbox committed")
		assert.Equal(t, "original-unchanged", lines[1], "which went into CMD's sandbox, not the original")
		assert.Equal(t, "0", lines[2], "the bind over the original stays in CMD's namespace")
		assertFile(t, filepath.Join(o, "inner.txt"), "inner\n")

		// The sandbox CMD created (and destroyed) was nested in CMD's.
		b, err := os.ReadFile(created)
		require.NoError(t, err)
		var child manager.SandboxInfo
		require.NoError(t, json.Unmarshal(b, &child), string(b))
		var out runJSON
		require.NoError(t, json.Unmarshal([]byte(lines[3]), &out), r.stdout)
		assert.Equal(t, e.list()[out.ID].Mountpoint, child.Original, "the child's original is the parent's mount")
	})
	t.Run("private", func(t *testing.T) {
		es, err := fsutil.ReadMountinfo()
		require.NoError(t, err)
		if root := fsutil.MountAt(es, "/"); root == nil || strings.Contains(root.Options, "shared") {
			t.Skip("this machine's mounts are shared: the daemon's mounts reach every namespace")
		}
		e := newManagedEnv(t)
		o := e.original("o")
		r := e.sbxfs("run", "--in-place", "--commit-on-success", o, "--", "sh", "-c", inner, "sh", e.bin, e.root, filepath.Join(e.base, "created.json"))
		assert.Equal(t, 1, r.code, r.stderr)
		assert.Contains(t, r.stderr, "this process's mount namespace does not see that mount")
		assert.Contains(t, r.stderr, "nothing was run")
		assert.NoFileExists(t, filepath.Join(o, "inner.txt"))
		for _, sb := range e.list() {
			assert.NotEqual(t, manager.Active, sb.State, "no sandbox is left active: %s", sb.ID)
		}
	})
}

// TestInPlaceVariableLeftInTheEnvironment: SBXFS_IN_PLACE_EXEC passed on
// to a command that is not the in-place process (sudo -E, say) is
// refused before anything is mounted or any mount's propagation changed
// (found by review).
func TestInPlaceVariableLeftInTheEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(sbxfsBin(t), "true")
	cmd.Env = append(os.Environ(), inPlaceEnv+`={"mountpoint":"`+dir+`","original":"`+dir+`","dir":"/"}`)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 126, ee.ExitCode())
	assert.Contains(t, string(out), "is not the in-place process of 'sbxfs run'")
}
