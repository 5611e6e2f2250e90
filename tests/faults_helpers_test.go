package tests

// Helpers of the fault and hostile-input tests (faults_test.go,
// hostile_test.go, soak_test.go).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cliRun is what one run of the sbxfs CLI gave.
type cliRun struct {
	code           int
	stdout, stderr string
	args           []string
}

func (r cliRun) String() string {
	return fmt.Sprintf("sbxfs %q: exit %d\nstdout: %s\nstderr: %s", r.args, r.code, r.stdout, r.stderr)
}

// requireCLI skips a test that needs the sbxfs CLI when it does not build
// (the stand-in has no commit).
func requireCLI(t testing.TB) {
	t.Helper()
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
}

// sbxfsCLI runs the sbxfs CLI with args, killing it after d; a CLI that
// does not finish in time fails the test.
func sbxfsCLI(t testing.TB, d time.Duration, args ...string) cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = childEnv()
	err := cmd.Run()
	r := cliRun{stdout: stdout.String(), stderr: stderr.String(), args: args}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("sbxfs %q did not finish within %v\nstdout: %s\nstderr: %s", args, d, r.stdout, r.stderr)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run sbxfs %q: %v", args, err)
	}
	return r
}

// assertCleanCLIError checks that a failed run exited with code and said
// so in one sbxfs message, without a Go trace.
func assertCleanCLIError(t testing.TB, r cliRun, code int) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d\n%s", r.code, code, r)
	}
	if !strings.HasPrefix(r.stderr, "sbxfs: ") {
		t.Errorf("stderr does not start with \"sbxfs: \":\n%s", r)
	}
	for _, bad := range []string{"goroutine ", "panic:", "runtime error"} {
		if strings.Contains(r.stderr, bad) {
			t.Errorf("stderr holds a Go trace (%q):\n%s", bad, r)
		}
	}
}

// tmpfsDir mounts a tmpfs of the given size (mount(8) syntax: "8m") on a
// new directory and unmounts it when the test ends (registered before
// anything mounted or created in it, so it goes last).
func tmpfsDir(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	d := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", d, err)
	}
	registerMount(d)
	t.Cleanup(func() {
		if err := unix.Unmount(d, 0); err != nil {
			t.Errorf("unmount the tmpfs %s: %v (unmounting lazily)", d, err)
			_ = unix.Unmount(d, unix.MNT_DETACH)
		}
	})
	return d
}

// resizeTmpfs changes the size of a tmpfs made by tmpfsDir.
func resizeTmpfs(t testing.TB, d, size string) {
	t.Helper()
	if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, "size="+size); err != nil {
		t.Fatalf("resize the tmpfs %s to %s: %v", d, size, err)
	}
}

// mountSandboxAt is mountSandbox with the sandbox directory (--upper) at
// state, which must not exist yet (the CLI makes it), so that it can live
// on a file system of the test's choosing.
func mountSandboxAt(t testing.TB, orig, state string, opts ...mountOption) *sandbox {
	t.Helper()
	requireCLI(t)
	sb := &sandbox{t: t, orig: orig, log: &syncBuffer{}}
	for _, o := range opts {
		o(&sb.opt)
	}
	if sb.opt.unprivileged || sb.useStandIn() {
		t.Fatal("mountSandboxAt serves with the CLI as root only")
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	sb.state = state
	sb.upper = filepath.Join(state, "upper")
	sb.work = filepath.Join(state, "work")
	sb.mnt = filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(sb.mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	registerMount(sb.mnt)
	t.Cleanup(func() { sb.cleanup() })
	sb.start(t)
	return sb
}

// serverPid is the pid of the process serving the sandbox, 0 when none runs.
func (sb *sandbox) serverPid() int {
	cmd, _ := sb.running()
	if cmd == nil {
		return 0
	}
	return cmd.Process.Pid
}

// unmountStale removes the dead mount of a killed server with `sbxfs
// unmount`, as a user would.
func unmountStale(t testing.TB, sb *sandbox) {
	t.Helper()
	r := sbxfsCLI(t, 30*time.Second, "unmount", sb.mnt)
	if r.code != 0 {
		t.Fatalf("unmount of the dead mount: %s", r)
	}
	if _, ok := mountAt(sb.mnt); ok {
		t.Fatalf("%s is still mounted after sbxfs unmount", sb.mnt)
	}
}

// patterned returns n bytes that depend on name: content a test can
// recognise later.
func patterned(name string, n int) []byte {
	b := make([]byte, 0, n+32)
	h := sha256.Sum256([]byte(name))
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%x:%d|", h[:6], i)
	}
	return b[:n]
}

// writeFsync creates p (it must not exist), writes data in chunks, fsyncs
// and closes it; the first error is returned with the step that failed.
func writeFsync(p string, data []byte, flags int) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|flags, 0o644)
	if err != nil {
		return err
	}
	for off := 0; off < len(data); {
		n := min(64<<10, len(data)-off)
		if _, err := f.Write(data[off : off+n]); err != nil {
			f.Close()
			return err
		}
		off += n
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// assertSameTree compares two walks and reports the differences.
func assertSameTree(t testing.TB, want, got map[string]nodeInfo, what string) bool {
	t.Helper()
	if d := diffTrees(want, got, 30); len(d) > 0 {
		t.Errorf("%s:\n  %s", what, strings.Join(d, "\n  "))
		return false
	}
	return true
}

// sentinelDir makes a directory outside every tree a test gives sbxfs,
// with a few files, and checks at the end that nothing in it changed.
func sentinelDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "sentinel")
	writeTree(t, d, map[string]string{"keep.txt": "sentinel", "sub/inner.txt": "inner", "sub/deep/x": "x"})
	originalGuard(t, d)
	return d
}
