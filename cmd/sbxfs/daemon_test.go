package main

import (
	"bytes"
	"encoding/json"
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
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/internal/immutable"
	"github.com/sbxfs/sbxfs/internal/shellwriter"
	"github.com/sbxfs/sbxfs/manager"
)

// The managed commands run as a user types them: the binary, in its own
// process, starting the daemon (another process) of a private state root.
// The test process only uses the mounts; it never serves one.

// managedEnv is a state root; its daemon is stopped when the test ends.
type managedEnv struct {
	t    *testing.T
	bin  string
	base string // holds the originals and the state root
	root string
}

func newManagedEnv(t *testing.T, opts ...func(*managedEnv)) *managedEnv {
	t.Helper()
	requireFuse(t)
	base := realTempDir(t)
	e := &managedEnv{t: t, bin: sbxfsBin(t), base: base, root: filepath.Join(base, "state")}
	for _, o := range opts {
		o(e)
	}
	t.Cleanup(e.stopDaemon)
	return e
}

// withRaceBin runs the env's commands and daemon with the binary built with
// -race when the tests are (sbxfsRaceBin).
func withRaceBin(e *managedEnv) { e.bin = sbxfsRaceBin(e.t) }

// sbxfs runs the binary on the env's state root.
func (e *managedEnv) sbxfs(args ...string) result {
	e.t.Helper()
	return runBin(e.t, e.bin, append([]string{"--state-dir", e.root}, args...)...)
}

// original makes a directory with a.txt.
func (e *managedEnv) original(name string) string {
	e.t.Helper()
	d := filepath.Join(e.base, name)
	require.NoError(e.t, os.MkdirAll(d, 0o755))
	require.NoError(e.t, os.WriteFile(filepath.Join(d, "a.txt"), []byte("hello\n"), 0o644))
	return d
}

// create runs sbxfs create --json and decodes the sandbox.
func (e *managedEnv) create(args ...string) manager.SandboxInfo {
	e.t.Helper()
	r := e.sbxfs(append([]string{"create", "--json"}, args...)...)
	require.Equal(e.t, 0, r.code, r.stderr)
	var sb manager.SandboxInfo
	require.NoError(e.t, json.Unmarshal([]byte(r.stdout), &sb), r.stdout)
	require.True(e.t, isMounted(e.t, sb.Mountpoint), "mounted when create returns")
	return sb
}

// list runs sbxfs list --json, by id.
func (e *managedEnv) list(args ...string) map[string]manager.SandboxInfo {
	e.t.Helper()
	r := e.sbxfs(append([]string{"list", "--json"}, args...)...)
	require.Equal(e.t, 0, r.code, r.stderr)
	var sbs []manager.SandboxInfo
	require.NoError(e.t, json.Unmarshal([]byte(r.stdout), &sbs), r.stdout)
	out := map[string]manager.SandboxInfo{}
	for _, sb := range sbs {
		out[sb.ID] = sb
	}
	return out
}

// daemonPid is the pid of the daemon answering, or 0.
func (e *managedEnv) daemonPid() int {
	d, err := manager.DialDaemon(e.root)
	if err != nil {
		return 0
	}
	defer d.Close()
	return d.Pid
}

// kill sends sig to the daemon and waits until it has exited: its hold on
// the state root is released (it may stay a zombie: nobody reaps it).
func (e *managedEnv) kill(sig syscall.Signal) bool {
	pid := e.daemonPid()
	if pid == 0 {
		return false
	}
	require.NoError(e.t, syscall.Kill(pid, sig))
	lock := filepath.Join(e.root, "manager.lock")
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		f, err := os.Open(lock)
		require.NoError(e.t, err)
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		f.Close()
		if err == nil {
			return true
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	e.t.Errorf("the daemon (pid %d) did not exit after %v", pid, sig)
	return true
}

// stopDaemon stops the daemon (SIGTERM then wait); its Close unmounts
// every sandbox. Anything still mounted under the state root is an error,
// unmounted lazily.
func (e *managedEnv) stopDaemon() {
	e.kill(syscall.SIGTERM)
	if b, err := os.ReadFile(daemonLog(e.root)); err == nil && bytes.Contains(b, []byte("WARNING: DATA RACE")) {
		e.t.Errorf("the daemon reported a data race:\n%s", b)
	}
	es, err := fsutil.ReadMountinfo()
	require.NoError(e.t, err)
	for _, m := range es {
		if within(m.Mountpoint, e.root) {
			e.t.Errorf("%s is still mounted after the daemon stopped", m.Mountpoint)
			abortFuse(e.t, m.Mountpoint)
			out, err := exec.Command("umount", "-l", m.Mountpoint).CombinedOutput()
			e.t.Logf("cleanup: umount -l %s: %v %s", m.Mountpoint, err, out)
		}
	}
}

// abortFuse aborts the FUSE connection of the mount at mnt (its server
// hung, or died in the middle of a request to one of its own mounts), so
// that nothing waits on it any more.
func abortFuse(t *testing.T, mnt string) {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return
	}
	for _, e := range mounts {
		if e.Mountpoint != mnt {
			continue
		}
		conn := fsutil.FuseConnDir(e.Dev)
		err := os.WriteFile(filepath.Join(conn, "abort"), []byte("1"), 0o200)
		t.Logf("cleanup: abort the FUSE connection %s of %s: %v", conn, mnt, err)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(data), 0o644))
}

func TestManagedPlanCommit(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o1, o2 := e.original("o1"), e.original("o2")
	s1, s2 := e.create("--plan", "p", "--name", "one", o1), e.create("--plan", "p", o2)
	assert.Equal(t, "p", s1.Plan)
	assert.Equal(t, "one", s1.Name)
	assert.Equal(t, manager.Active, s1.State)
	writeFile(t, filepath.Join(s1.Mountpoint, "new1"), "one\n")
	writeFile(t, filepath.Join(s2.Mountpoint, "a.txt"), "two\n")
	assert.NoFileExists(t, filepath.Join(o1, "new1"))

	l := e.list("--plan", "p")
	require.Len(t, l, 2)
	for _, id := range []string{s1.ID, s2.ID} {
		assert.Equal(t, manager.Active, l[id].State)
		assert.True(t, l[id].Mounted)
	}
	r := e.sbxfs("list", "--plan", "p")
	require.Equal(t, 0, r.code, r.stderr)
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n")[1:] {
		f := strings.Fields(line)
		want := map[string]string{s1.ID: "one", s2.ID: "-"}[f[0]] // no name: "-", not "."
		assert.Equal(t, want, f[len(f)-1], "NAME of %s", line)
	}

	r = e.sbxfs("commit", "--plan", "p", "-m", "msg", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var res planJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, []string{s1.ID, s2.ID}, res.Committed)
	assert.Empty(t, res.RollbackFailed)
	assertFile(t, filepath.Join(o1, "new1"), "one\n")
	assertFile(t, filepath.Join(o2, "a.txt"), "two\n")
	assert.False(t, isMounted(t, s1.Mountpoint), "commit unmounts")
	assert.False(t, isMounted(t, s2.Mountpoint))
	for _, sb := range e.list() {
		assert.Equal(t, manager.Committed, sb.State)
	}
	r = e.sbxfs("commit", "--plan", "p")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "nothing to commit")
	r = e.sbxfs("commit", s1.ID)
	assertFailure(t, r, exitState, "not active")
}

func TestManagedPlanConflict(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o1, o2 := e.original("o1"), e.original("o2")
	s1, s2 := e.create("--plan", "p", o1), e.create("--plan", "p", o2)
	writeFile(t, filepath.Join(s1.Mountpoint, "a.txt"), "mine 1\n")
	writeFile(t, filepath.Join(s2.Mountpoint, "a.txt"), "mine 2\n")
	writeFile(t, filepath.Join(o2, "a.txt"), "theirs\n") // underneath the second sandbox

	r := e.sbxfs("commit", "--plan", "p", "--json")
	assertFailure(t, r, exitConflict, "a.txt")
	var res planJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Empty(t, res.Committed)
	assert.ElementsMatch(t, []string{s1.ID, s2.ID}, res.RolledBack)
	assert.Equal(t, manager.CodeConflict, res.Code)
	assertFile(t, filepath.Join(o1, "a.txt"), "hello\n")
	assertFile(t, filepath.Join(o2, "a.txt"), "theirs\n")
	for _, sb := range []manager.SandboxInfo{s1, s2} {
		assert.True(t, isMounted(t, sb.Mountpoint), "still mounted, retryable")
		assert.Equal(t, manager.Active, e.list()[sb.ID].State)
	}
	assertFile(t, filepath.Join(s1.Mountpoint, "a.txt"), "mine 1\n")

	// Resolved in the sandbox's favour, by its mountpoint (the daemon
	// commits what resolve recorded); --force is TestManagedNestedParentConflict's.
	r = e.sbxfs("resolve", s2.Mountpoint, "a.txt")
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o2, "a.txt"), "theirs\n")
	r = e.sbxfs("commit", "--plan", "p")
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o1, "a.txt"), "mine 1\n")
	assertFile(t, filepath.Join(o2, "a.txt"), "mine 2\n")
}

func TestManagedRollbackDestroyGC(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o1, o2 := e.original("o1"), e.original("o2")
	s1, s2 := e.create("--plan", "p", o1), e.create("--plan", "p", o2)
	writeFile(t, filepath.Join(s1.Mountpoint, "a.txt"), "discard\n")
	r := e.sbxfs("rollback", "--plan", "p", "--keep")
	require.Equal(t, 0, r.code, r.stderr)
	assert.True(t, isMounted(t, s1.Mountpoint), "--keep stays mounted")
	assertFile(t, filepath.Join(s1.Mountpoint, "a.txt"), "hello\n")

	writeFile(t, filepath.Join(s2.Mountpoint, "new"), "discard\n")
	r = e.sbxfs("rollback", "--plan", "p", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var res batchJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, []string{s1.ID, s2.ID}, res.Done)
	assert.False(t, isMounted(t, s2.Mountpoint))
	assert.NoFileExists(t, filepath.Join(o2, "new"))
	assert.Equal(t, manager.RolledBack, e.list()[s2.ID].State)

	// A managed sandbox named by its mountpoint goes through the daemon.
	s3 := e.create(o1)
	writeFile(t, filepath.Join(s3.Mountpoint, "c"), "c\n")
	r = e.sbxfs("commit", s3.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o1, "c"), "c\n")
	assert.Equal(t, manager.Committed, e.list()[s3.ID].State, "the registry knows")

	s4 := e.create(o2)
	for range 2 {
		r = e.sbxfs("destroy", s4.ID)
		require.Equal(t, 0, r.code, "destroy twice is fine: %s", r.stderr)
	}
	assert.False(t, isMounted(t, s4.Mountpoint))
	assert.Equal(t, manager.CleanedUp, e.list()[s4.ID].State)
	assertFailure(t, e.sbxfs("destroy", "0123456789abcdef"), exitNotSbxfs, "no such sandbox")
	assertFailure(t, e.sbxfs("destroy"), exitUsage, "ID or --plan P")

	// A plan no sandbox was ever made in is a misspelt name: refused, not
	// a success with nothing done. A plan with none active has nothing
	// to commit.
	for _, cmd := range []string{"commit", "rollback", "destroy"} {
		assertFailure(t, e.sbxfs(cmd, "--plan", "nosuch"), exitNotSbxfs, "no such sandbox in plan nosuch; see 'sbxfs list'")
	}
	r = e.sbxfs("commit", "--plan", "p")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "nothing to commit in plan p\n", r.stdout)

	r = e.sbxfs("gc", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, "gc", res.Op)
	assert.Empty(t, res.Failed)
}

// TestManagedCommitOfABusyMount: through the daemon too, a commit whose
// mount is in use (a shell working in it) succeeds, says that the sandbox
// stays mounted (on stderr; still_mounted with --json), and leaves it
// active with an empty sandbox, until a commit once nothing uses it.
func TestManagedCommitOfABusyMount(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	sb := e.create(o)
	writeFile(t, filepath.Join(sb.Mountpoint, "a.txt"), "mine\n")
	w := shellwriter.Run(t, sb.Mountpoint)

	r := e.sbxfs("commit", sb.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "committed "+sb.ID)
	assert.Contains(t, r.stderr, "is in use: it stays mounted over the updated original with an empty sandbox")
	assertFile(t, filepath.Join(o, "a.txt"), "mine\n")
	assert.True(t, isMounted(t, sb.Mountpoint))
	assert.Equal(t, manager.Active, e.list()[sb.ID].State)

	require.True(t, w.WaitCreated(len(w.Created())+1, 10*time.Second), "thawed: the shell goes on")
	r = e.sbxfs("commit", "--json", sb.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	var res planJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, []string{sb.ID}, res.StillMounted)

	// A rollback of a busy mount refuses (nothing discarded: the commit
	// below still brings every file the shell made) and names --keep.
	r = e.sbxfs("rollback", sb.ID)
	assertFailure(t, r, exitBusy, "close the files or processes using the sandbox, or retry (or roll back with --keep: the sandbox is emptied and stays mounted for them)")

	w.Stop()
	r = e.sbxfs("commit", "--json", sb.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	res = planJSON{}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, []string{sb.ID}, res.Committed)
	assert.Empty(t, res.StillMounted)
	assert.False(t, isMounted(t, sb.Mountpoint))
	for _, n := range w.Created() {
		assertFile(t, filepath.Join(o, "n"+n), n+"\n")
	}
}

// TestManagedRunLeavesAProcessBehind: a process CMD started and left in
// the mount keeps it busy; run --commit-on-success commits, says that the
// sandbox stays mounted, and how to end it.
func TestManagedRunLeavesAProcessBehind(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	pidFile := filepath.Join(e.base, "pid")
	r := e.sbxfs("run", "--commit-on-success", o, "--", "sh", "-c", "echo hi > f; sleep 60 </dev/null >/dev/null 2>&1 & echo $! > "+pidFile)
	t.Cleanup(func() { // before the daemon's cleanup, registered earlier
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "f"), "hi\n")
	assert.Contains(t, r.stderr, "committed, but something CMD started still uses")
	assert.Contains(t, r.stderr, "'sbxfs destroy ")
	var active []string
	for id, sb := range e.list() {
		if sb.State == manager.Active {
			active = append(active, id)
			assert.True(t, isMounted(t, sb.Mountpoint), "it stays mounted")
		}
	}
	assert.Len(t, active, 1)
}

// TestManagedRunFromASubdirectory: run from a directory inside ORIGINAL
// starts CMD in the same directory of the mount (it started at the
// mount's root: the current directory was taken as ".").
func TestManagedRunFromASubdirectory(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	require.NoError(t, os.MkdirAll(filepath.Join(o, "sub", "deeper"), 0o755))
	cmd := exec.Command(e.bin, "--state-dir", e.root, "run", "--json", o, "--", "sh", "-c", "pwd; cat ../../a.txt")
	cmd.Dir = filepath.Join(o, "sub", "deeper")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	lines := strings.SplitN(stdout.String(), "\n", 3)
	require.Len(t, lines, 3, stdout.String())
	var out runJSON
	require.NoError(t, json.Unmarshal([]byte(lines[2]), &out), stdout.String())
	assert.Equal(t, filepath.Join(out.Mountpoint, "sub", "deeper"), lines[0])
	assert.Equal(t, "hello", lines[1])
}

// TestManagedRunKeep: run --keep keeps a sandbox it does not commit, for
// review by id: status and diff name it by its id as commit does.
func TestManagedRunKeep(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	r := e.sbxfs("run", "--keep", "--json", o, "--", "sh", "-c", "echo kept > k.txt; exit 3")
	assert.Equal(t, 3, r.code, r.stderr)
	assert.Contains(t, r.stderr, "keeps CMD's changes, mounted at ")
	assert.Contains(t, r.stderr, "sh exited with status 3; the sandbox ")
	var out runJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	assert.True(t, out.Kept)
	assert.False(t, out.Destroyed)
	assert.NoFileExists(t, filepath.Join(o, "k.txt"))
	assertFile(t, filepath.Join(out.Mountpoint, "k.txt"), "kept\n")

	r = e.sbxfs("status", out.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "A k.txt")
	r = e.sbxfs("diff", out.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "+kept")
	r = e.sbxfs("commit", out.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "k.txt"), "kept\n")

	r = e.sbxfs("run", "--keep", "--commit-on-success", o, "--", "sh", "-c", "echo now > n.txt")
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "n.txt"), "now\n") // committed: --keep keeps only what is not
}

func TestManagedRun(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	r := e.sbxfs("run", "--commit-on-success", o, "--", "sh", "-c", "echo hi > f")
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "f"), "hi\n")

	r = e.sbxfs("run", o, "--", "false")
	assertFailure(t, r, 1, "false exited with status 1")
	r = e.sbxfs("run", "--commit-on-success", "--json", o, "--", "sh", "-c", "echo gone > g; pwd; exit 3")
	assert.Equal(t, 3, r.code, r.stderr)
	lines := strings.SplitN(r.stdout, "\n", 2)
	require.Len(t, lines, 2)
	var out runJSON
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &out), r.stdout)
	assert.Equal(t, out.Mountpoint, lines[0], "CMD runs inside the mount")
	assert.Equal(t, 3, out.ExitCode)
	assert.True(t, out.Destroyed)
	assert.False(t, out.Committed)
	assert.NoFileExists(t, filepath.Join(o, "g"), "the original is unchanged")
	ents, err := os.ReadDir(o)
	require.NoError(t, err)
	assert.Len(t, ents, 2, "a.txt and f only")
	for _, sb := range e.list() {
		assert.False(t, sb.Mounted, "no sandbox of run stays mounted: %s", sb.ID)
	}
}

// TestManagedRunConflict: CMD changes a file in the sandbox and the same
// file of the original behind it; the commit after it is refused (exit
// 7), the sandbox stays mounted with its changes, the message says how to
// go on, and resolve then commit takes it there.
func TestManagedRunConflict(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	r := e.sbxfs("run", "--commit-on-success", "--json", o, "--", "sh", "-c", "echo mine > a.txt; echo theirs > \"$1\"/a.txt", "sh", o)
	assertFailure(t, r, exitConflict, "a.txt: content changed in the original")
	assert.Contains(t, r.stderr, "sbxfs resolve ")
	var out runJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	assert.False(t, out.Committed)
	assert.False(t, out.Destroyed)
	assertFile(t, filepath.Join(o, "a.txt"), "theirs\n")
	assert.True(t, isMounted(t, out.Mountpoint), "the sandbox stays mounted")

	r = e.sbxfs("resolve", out.ID) // by its id
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "a.txt: content changed in the original")
	r = e.sbxfs("resolve", out.Mountpoint, "a.txt")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.sbxfs("commit", out.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "a.txt"), "mine\n")
}

// TestManagedRunCommitRefusedByTheFileSystem: a commit of 'sbxfs run' the
// original's file system refuses keeps the sandbox mounted and says to
// commit it once the cause is settled (not to resolve conflicts it does
// not have); the daemon passes the system error on (errno in --json).
// The command makes the original's directory immutable after its change
// in the sandbox (one made immutable before is refused in the sandbox).
func TestManagedRunCommitRefusedByTheFileSystem(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	sub := filepath.Join(o, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	undo := immutable.Set(t, sub) // skips where it cannot be done
	undo()
	r := e.sbxfs("run", "--commit-on-success", "--json", o, "--", "sh", "-c", `echo new > sub/new && chattr +i "$0"`, sub)
	assertFailure(t, r, exitCommitFailed, "operation not permitted")
	assert.Contains(t, r.stderr, "may be immutable or append-only")
	assert.Contains(t, r.stderr, "' once the cause is settled, or 'sbxfs destroy ")
	assert.NotContains(t, r.stderr, "sbxfs resolve")
	var out runJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.NotNil(t, out.Commit)
	assert.Equal(t, "EPERM", out.Commit.Errno)
	assert.False(t, out.Committed)
	assert.NoFileExists(t, filepath.Join(o, "sub", "new"))
	assert.True(t, isMounted(t, out.Mountpoint), "the sandbox stays mounted")

	undo()
	r = e.sbxfs("commit", out.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "sub", "new"), "new\n")
}

// TestDaemonLogIsSetAside: a daemon that starts with a log past
// logLimit sets it aside as daemon.log.1 and begins a new one.
func TestDaemonLogIsSetAside(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	require.NoError(t, os.MkdirAll(e.root, 0o700))
	log := filepath.Join(e.root, "daemon.log")
	old := strings.Repeat("an old line of the daemon's log\n", logLimit/32+1)
	require.NoError(t, os.WriteFile(log, []byte(old), 0o600))
	e.list() // starts the daemon
	assertFile(t, log+".1", old)
	st, err := os.Stat(log)
	require.NoError(t, err)
	assert.Less(t, st.Size(), int64(64<<10), "a new log")
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
}

func TestDaemonRestart(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	sb := e.create(o)
	writeFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	first := e.daemonPid()
	require.True(t, e.kill(syscall.SIGKILL))

	l := e.list() // starts a new daemon
	assert.NotEqual(t, first, e.daemonPid())
	assert.Equal(t, manager.Active, l[sb.ID].State)
	assert.True(t, l[sb.ID].Mounted)
	assert.True(t, isMounted(t, sb.Mountpoint), "the mount is back")
	assertFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	assert.NoFileExists(t, filepath.Join(o, "kept"))

	// A clean stop keeps the sandbox active too.
	require.True(t, e.kill(syscall.SIGTERM))
	assert.False(t, isMounted(t, sb.Mountpoint), "a stopped daemon unmounts")
	r := e.sbxfs("commit", sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "kept"), "kept\n")
}

func TestDaemonCommand(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	r := e.sbxfs("daemon")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "started")
	pid := e.daemonPid()
	require.NotZero(t, pid)
	assertFailure(t, e.sbxfs("daemon"), exitBusy, "already serves")
	assertFailure(t, e.sbxfs("daemon", "--foreground"), exitBusy, "already serves")
	assert.Equal(t, pid, e.daemonPid(), "the first daemon still serves")
	st, err := os.Stat(filepath.Join(e.root, manager.DaemonSocket))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
}

// daemon --no-io-uring keeps every mount of the daemon on /dev/fuse; a
// daemon started by a managed command takes io_uring where the kernel
// offers it. The daemon's log names each mount's transport.
func TestDaemonTransport(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	r := e.sbxfs("daemon", "--no-io-uring")
	require.Equal(t, 0, r.code, r.stderr)
	sb := e.create(e.original("o"))
	assertFile(t, filepath.Join(sb.Mountpoint, "a.txt"), "hello\n")
	assert.Equal(t, "/dev/fuse", e.transport(sb.ID), "--no-io-uring")

	require.True(t, e.kill(syscall.SIGTERM))
	assert.True(t, e.list()[sb.ID].Mounted, "mounted again by a daemon the command started")
	assertFile(t, filepath.Join(sb.Mountpoint, "a.txt"), "hello\n")
	want := "/dev/fuse"
	if b, err := os.ReadFile("/sys/module/fuse/parameters/enable_uring"); err == nil && strings.TrimSpace(string(b)) == "Y" {
		want = "io_uring"
	}
	assert.Equal(t, want, e.transport(sb.ID), "without --no-io-uring")
}

// transport is the transport of the last mount of sandbox id in the
// daemon's log.
func (e *managedEnv) transport(id string) string {
	e.t.Helper()
	b, err := os.ReadFile(daemonLog(e.root))
	require.NoError(e.t, err)
	got := ""
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, `msg="sandbox mounted"`) || !strings.Contains(l, "sandbox="+id) {
			continue
		}
		if i := strings.Index(l, "transport="); i >= 0 {
			got = strings.Fields(l[i+len("transport="):])[0]
		}
	}
	require.NotEmpty(e.t, got, "no \"sandbox mounted\" line for %s in the daemon's log", id)
	return got
}
