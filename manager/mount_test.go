package manager

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/internal/shellwriter"
)

// daemon is a testdaemon process serving one mounted sandbox: this test
// process only uses the mount, never serves it.
type daemon struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	id    string
	mnt   string
}

type daemonAnswer struct {
	Result struct {
		Committed    []string `json:"committed"`
		StillMounted []string `json:"still_mounted"`
		Done         []string `json:"done"`
		ID           string   `json:"id"`      // mount: the sandbox
		State        State    `json:"state"`   // mount
		Mounted      bool     `json:"mounted"` // mount
	} `json:"result"`
	Err string `json:"err"`
}

func startDaemon(t *testing.T, root, orig string) *daemon {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	bin := testdaemonBin(t)
	d := &daemon{t: t, cmd: exec.Command(bin, root, orig), lines: make(chan string, 16)}
	d.cmd.Stderr = &testWriter{t}
	var err error
	d.in, err = d.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := d.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, d.cmd.Start())
	t.Cleanup(d.stop)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		close(d.lines)
	}()
	f := strings.Fields(d.next("READY"))
	require.Len(t, f, 3)
	d.id, d.mnt = f[1], f[2]
	return d
}

var testdaemonBuild struct {
	once     sync.Once
	dir, bin string
	err      error
}

// testdaemonBin builds the testdaemon once per test run (TestMain removes
// it) and returns its path.
func testdaemonBin(t *testing.T) string {
	t.Helper()
	b := &testdaemonBuild
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "sbxfs-testdaemon-"); b.err != nil {
			return
		}
		b.bin = filepath.Join(b.dir, "testdaemon")
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		out, err := exec.Command(gobin, "build", "-o", b.bin, "./internal/testdaemon").CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("build testdaemon: %v: %s", err, out)
		}
	})
	require.NoError(t, b.err)
	return b.bin
}

// next returns the next line starting with prefix.
func (d *daemon) next(prefix string) string {
	d.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-d.lines:
			require.True(d.t, ok, "the daemon exited before %s", prefix)
			if strings.HasPrefix(l, prefix) {
				return l
			}
			d.t.Logf("daemon (skipped, waiting for %s): %s", prefix, l)
		case <-timeout:
			d.t.Fatalf("no %s from the daemon", prefix)
		}
	}
}

func (d *daemon) send(cmd string) {
	_, err := io.WriteString(d.in, cmd+"\n")
	require.NoError(d.t, err)
}

func (d *daemon) answer() daemonAnswer {
	var a daemonAnswer
	require.NoError(d.t, json.Unmarshal([]byte(strings.TrimPrefix(d.next("RESULT "), "RESULT ")), &a))
	return a
}

// stop ends the daemon: quit, then kill; a mount left behind is detached.
func (d *daemon) stop() {
	_ = d.in.Close()
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
	if fsutil.IsStaleMount(d.mnt) || mounted(d.mnt) {
		_ = lazyDetach(d.mnt)
	}
}

func mounted(mnt string) bool {
	ms, _ := fsutil.ReadMountinfo()
	for _, e := range ms {
		if e.Mountpoint == mnt {
			return true
		}
	}
	return false
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// A mounted sandbox commits with Freeze: a file open for writing makes
// the commit fail (nothing applied, the mount thawed); a write made during
// a commit waits, and lands in the kept sandbox, not in the original.
func TestMountedSandboxCommitsFrozen(t *testing.T) {
	root := t.TempDir()
	orig := makeTree(t, fixtureFiles)
	old := snapshot(t, orig)
	d := startDaemon(t, root, orig)
	require.NoError(t, os.WriteFile(filepath.Join(d.mnt, "f"), []byte("through the mount"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(d.mnt, "gone")))

	open, err := os.OpenFile(filepath.Join(d.mnt, "busy"), os.O_CREATE|os.O_WRONLY, 0o644)
	require.NoError(t, err)
	d.send("commit")
	a := d.answer()
	assert.Contains(t, a.Err, "open for writing")
	assert.Empty(t, a.Result.Committed)
	assert.Equal(t, old, snapshot(t, orig), "nothing applied")
	_, err = open.WriteString("still writable: thawed")
	require.NoError(t, err)
	require.NoError(t, open.Close())

	// FUSE releases a closed file asynchronously: give the freeze a wait.
	d.send("commit keep slow wait=5s")
	d.next("INSIDE")
	start := time.Now()
	require.NoError(t, os.WriteFile(filepath.Join(d.mnt, "during"), []byte("d"), 0o644))
	assert.Greater(t, time.Since(start), 200*time.Millisecond, "the write waited for the commit")
	a = d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, []string{d.id}, a.Result.Committed)
	assert.Equal(t, "through the mount", readFile(t, orig, "f"))
	assert.Equal(t, "still writable: thawed", readFile(t, orig, "busy"))
	assert.NoFileExists(t, filepath.Join(orig, "gone"))
	assert.NoFileExists(t, filepath.Join(orig, "during"), "the write made during the commit is not in it")
	assert.Equal(t, "d", readFile(t, d.mnt, "during"), "it is in the kept sandbox")
	assert.Equal(t, "through the mount", readFile(t, d.mnt, "f"), "the mount shows the new original")

	d.send("commit wait=5s")
	a = d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, "d", readFile(t, orig, "during"))
	assert.False(t, mounted(d.mnt), "unmounted after a commit without keep")
	assert.NoDirExists(t, d.mnt)
}

// A commit of a mount a shell keeps busy (its working directory is in
// it): the commit succeeds, the mount stays up over the new original with
// an empty sandbox, and every file the shell made after the freeze is in
// that sandbox, none lost; the next commit takes them. (Until 2026-11-26
// the failed unmount thawed the mount and the reset froze it again: what
// the shell made in between, while the unmount was retried, was reset
// away.)
func TestMountedSandboxCommitWhileBusy(t *testing.T) {
	root := t.TempDir()
	orig := makeTree(t, fixtureFiles)
	d := startDaemon(t, root, orig)
	require.NoError(t, os.WriteFile(filepath.Join(d.mnt, "f"), []byte("through the mount"), 0o644))
	w := shellwriter.Run(t, d.mnt)

	d.send("commit wait=5s")
	a := d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, []string{d.id}, a.Result.Committed)
	assert.Equal(t, []string{d.id}, a.Result.StillMounted, "the result says it stays mounted")
	assert.True(t, mounted(d.mnt), "a busy mount stays mounted")
	assert.Equal(t, "through the mount", readFile(t, orig, "f"))
	require.True(t, w.WaitCreated(len(w.Created())+3, 10*time.Second), "thawed: the shell goes on")
	w.Stop()
	made := w.Created()
	for _, n := range made {
		assert.Equal(t, n+"\n", readFile(t, d.mnt, "n"+n), "made by the shell")
	}

	d.send("commit wait=5s")
	a = d.answer()
	require.Empty(t, a.Err)
	assert.Empty(t, a.Result.StillMounted)
	assert.False(t, mounted(d.mnt), "no longer busy: unmounted")
	for _, n := range made {
		assert.Equal(t, n+"\n", readFile(t, orig, "n"+n))
	}
}

// New mounts every active sandbox again: after a clean Close, and after
// the serving process was killed (its stale mounts are detached first).
func TestMountedSandboxSurvivesRestart(t *testing.T) {
	root := t.TempDir()
	orig := makeTree(t, fixtureFiles)
	d1 := startDaemon(t, root, orig)
	require.NoError(t, os.WriteFile(filepath.Join(d1.mnt, "x"), []byte("kept"), 0o644))
	d1.send("quit")
	d1.stop()
	assert.False(t, mounted(d1.mnt), "Close unmounts")

	d2 := startDaemon(t, root, orig)
	assert.Equal(t, "kept", readFile(t, d1.mnt, "x"), "mounted again by the next manager")
	require.NoError(t, d2.cmd.Process.Kill())
	_ = d2.cmd.Wait()
	// With io_uring the kernel tears the connection down after the process
	// is gone, from a work queue: statfs waits for that and ends with
	// ECONNABORTED. The first answer is logged for when it is not stale.
	var st unix.Statfs_t
	t.Logf("statfs of the killed server's mount: %v", unix.Statfs(d1.mnt, &st))
	assert.Eventually(t, func() bool { return fsutil.IsStaleMount(d1.mnt) }, 5*time.Second, 10*time.Millisecond,
		"a killed server leaves stale mounts")
	m := open(t, root) // not mounting: GC detaches the stale mounts
	res, err := m.GC(ctx)
	require.NoError(t, err)
	assert.Subset(t, res.Done, []string{d1.id, d2.id})
	assert.False(t, mounted(d1.mnt))
	require.NoError(t, m.Close())

	d3 := startDaemon(t, root, orig)
	assert.Equal(t, "kept", readFile(t, d1.mnt, "x"), "the stale mount was replaced")
	d3.send("commit wait=5s")
	a := d3.answer()
	require.Empty(t, a.Err)
	assert.Len(t, a.Result.Committed, 3, "the three sandboxes of plan p")
	assert.Equal(t, "kept", readFile(t, orig, "x"))
	for _, mnt := range []string{d1.mnt, d2.mnt, d3.mnt} {
		assert.False(t, mounted(mnt))
	}
}
