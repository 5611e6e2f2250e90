// Package tests holds the integration tests of sbxfs: real FUSE mounts
// served by a separate server process, exercised with real syscalls and
// real tools.
//
// The server is the `sbxfs` CLI (`sbxfs mount --foreground`) when
// ./cmd/sbxfs builds, or $SBXFS_BIN when set; otherwise, and for tests that
// need a mount option the CLI does not offer, the stand-in in
// tests/internal/devserver. A test never serves a mount in its own process.
package tests

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbxfs/sbxfs/layers"
)

var (
	flagSeed    = flag.Int64("seed", 0, "seed of the differential tests (0: from the clock)")
	flagDiffOps = flag.Int("diff.ops", 3000, "operations per differential test run")
)

// Environment variables of the harness.
const (
	envBin       = "SBXFS_BIN"         // a prebuilt sbxfs CLI to test
	envServer    = "SBXFS_SERVER"      // "standin": never use the CLI
	envServerRce = "SBXFS_SERVER_RACE" // "0": build the server without -race
	envHelper    = "SBXFS_TEST_HELPER" // set in a re-executed test binary: run a helper, not the tests
	envChildMnt  = "SBXFS_CHILD_MNT"   // the mount a re-executed test binary works on
	envChildTest = "SBXFS_CHILD_TEST"  // the posixtest entry it runs
)

const mountTimeout = 10 * time.Second

// The binaries every test uses, built once by TestMain.
var (
	binDir      string // mode 0755, so the unprivileged user can run what is in it
	cliBin      string // the sbxfs CLI, "" when it does not build
	cliErr      string // why cliBin is empty
	standInBin  string // tests/internal/devserver
	faultyBin   string // tests/internal/faultyfs
	testBinCopy string // copy of this test binary, runnable by nobody
	testBinMu   sync.Mutex
)

// mounts remembers every mountpoint the tests created, so TestMain can
// refuse to finish while one of them is still mounted.
var mounts = struct {
	sync.Mutex
	paths map[string]bool
}{paths: map[string]bool{}}

func registerMount(p string) {
	mounts.Lock()
	mounts.paths[p] = true
	mounts.Unlock()
}

func TestMain(m *testing.M) {
	flag.Parse()
	if h := os.Getenv(envHelper); h != "" {
		os.Exit(runHelper(h, flag.Args()))
	}
	if os.Getenv(envChildMnt) != "" {
		os.Exit(m.Run()) // a re-executed test binary: no builds, no checks
	}
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbxfs tests:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func runTests(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "sbxfs-tests-bin-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return 1, err
	}
	binDir = dir
	if err := buildBinaries(); err != nil {
		return 1, err
	}
	code := m.Run()
	if left := leftoverMounts(); len(left) > 0 {
		var names []string
		for _, e := range left {
			names = append(names, e.point+" ("+e.fstype+")")
			_, _ = runTimeout(10*time.Second, "umount", "-l", e.point)
		}
		return 1, fmt.Errorf("mounts left behind by the tests (now lazily unmounted): %s", strings.Join(names, ", "))
	}
	return code, nil
}

// leftoverMounts lists the registered mountpoints still mounted.
func leftoverMounts() []mountEntry {
	mounts.Lock()
	defer mounts.Unlock()
	var left []mountEntry
	for _, e := range readMountInfo() {
		if mounts.paths[e.point] {
			left = append(left, e)
		}
	}
	return left
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func moduleRoot() (string, error) {
	out, err := exec.Command(goTool(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// buildBinaries builds the stand-in, and the CLI unless $SBXFS_BIN names
// one. A CLI that does not build is not an error: the stand-in serves.
func buildBinaries() error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	build := func(out, pkg string) error {
		args := []string{"build", "-o", out}
		if raceEnabled && os.Getenv(envServerRce) != "0" {
			args = append(args, "-race") // races in the server fail the tests too
		}
		cmd := exec.Command(goTool(), append(args, pkg)...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
		return nil
	}
	standInBin = filepath.Join(binDir, "devserver")
	if err := build(standInBin, "./tests/internal/devserver"); err != nil {
		return err
	}
	faultyBin = filepath.Join(binDir, "faultyfs")
	if err := build(faultyBin, "./tests/internal/faultyfs"); err != nil {
		return err
	}
	switch {
	case os.Getenv(envServer) == "standin":
		cliErr = "forced by " + envServer + "=standin"
	case os.Getenv(envBin) != "":
		cliBin = os.Getenv(envBin)
	default:
		p := filepath.Join(binDir, "sbxfs")
		if err := build(p, "./cmd/sbxfs"); err != nil {
			cliErr = "./cmd/sbxfs does not build: " + err.Error()
		} else {
			cliBin = p
		}
	}
	if cliBin != "" {
		fmt.Printf("sbxfs tests: server = CLI %s (mount --foreground)\n", cliBin)
	} else {
		fmt.Printf("sbxfs tests: server = stand-in tests/internal/devserver (%s)\n", oneLine(cliErr))
	}
	return nil
}

// oneLine squeezes a (build) message onto one line of at most 300 bytes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// --- the sandbox ---

type mountOptions struct {
	unprivileged  bool     // the server runs as nobody; dirs are chowned to it
	allowOther    bool     // allow_other
	extraLowers   []string // layers below the original (stand-in only)
	noPassthrough bool
	noIOUring     bool          // --no-io-uring
	env           []string      // extra environment of the server
	standIn       bool          // use the stand-in even when the CLI builds
	serverErrors  bool          // the test provokes server errors: do not fail on them
	mountedOnly   bool          // start returns once the mount is in mountinfo
	debug         bool          // the server logs every FUSE request (sb.requests)
	timeout       time.Duration // the kernel's cache timeouts (stand-in only)
	stateIn       string        // the directory the sandbox's state dir is made in ("": a temporary one)
}

type mountOption func(*mountOptions)

// asNobody runs the server as the unprivileged user nobody, mounting
// through fusermount3; the original, state dir and mountpoint are chowned
// to nobody.
func asNobody() mountOption { return func(o *mountOptions) { o.unprivileged = true } }

// withAllowOther mounts with allow_other.
func withAllowOther() mountOption { return func(o *mountOptions) { o.allowOther = true } }

// withLowers stacks extra read-only layers below the original (stand-in).
func withLowers(dirs ...string) mountOption {
	return func(o *mountOptions) { o.extraLowers = append(o.extraLowers, dirs...) }
}

// withStandIn forces the stand-in server (an exact fuse.Config).
func withStandIn() mountOption { return func(o *mountOptions) { o.standIn = true } }

// withTimeout sets the kernel's entry, attribute and negative cache
// timeouts (stand-in).
func withTimeout(d time.Duration) mountOption { return func(o *mountOptions) { o.timeout = d } }

// withNoPassthrough turns FUSE passthrough off.
func withNoPassthrough() mountOption { return func(o *mountOptions) { o.noPassthrough = true } }

// withNoIOUring keeps the server's requests on /dev/fuse.
func withNoIOUring() mountOption { return func(o *mountOptions) { o.noIOUring = true } }

// withServerEnv adds variables to the server's environment.
func withServerEnv(kv ...string) mountOption {
	return func(o *mountOptions) { o.env = append(o.env, kv...) }
}

// allowServerErrors keeps error lines in the server's log from failing the
// test (for tests that kill or starve the server on purpose).
func allowServerErrors() mountOption { return func(o *mountOptions) { o.serverErrors = true } }

// mountedOnly makes mountSandbox return as soon as the mount shows up in
// mountinfo, before the server reports that it serves.
func mountedOnly() mountOption { return func(o *mountOptions) { o.mountedOnly = true } }

// withStateIn makes the sandbox's state dir (upper/ and work/) in dir.
func withStateIn(dir string) mountOption { return func(o *mountOptions) { o.stateIn = dir } }

// withDebug makes the server log every FUSE request it receives, for
// tests of what the kernel asks (sb.requests).
func withDebug() mountOption { return func(o *mountOptions) { o.debug = true } }

// sandbox is one sbxfs mount served by a child process.
type sandbox struct {
	t     testing.TB
	orig  string
	state string // holds upper/ and work/
	upper string
	work  string
	mnt   string
	opt   mountOptions

	log *syncBuffer // everything every server run printed

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	runs int
	dev  string // major:minor of the mount, for fusectl
}

// path joins rel parts to the mountpoint.
func (sb *sandbox) path(rel ...string) string {
	return filepath.Join(append([]string{sb.mnt}, rel...)...)
}

// upperPath joins rel parts to the upper layer.
func (sb *sandbox) upperPath(rel ...string) string {
	return filepath.Join(append([]string{sb.upper}, rel...)...)
}

func (sb *sandbox) useStandIn() bool {
	o := sb.opt
	return cliBin == "" || o.standIn || len(o.extraLowers) > 0 || o.timeout != 0
}

// serverName says which server serves this sandbox, for messages.
func (sb *sandbox) serverName() string {
	if sb.useStandIn() {
		return "stand-in"
	}
	return "sbxfs CLI"
}

// layersConfig is the overlay configuration the server uses, as recorded
// in the sandbox record when there is one.
func (sb *sandbox) layersConfig() layers.Config {
	if m, err := layers.ReadMeta(sb.work); err == nil {
		return m.Config(sb.work)
	}
	return layers.Config{
		Upper:      sb.upper,
		Work:       sb.work,
		Lowers:     append([]string{sb.orig}, sb.opt.extraLowers...),
		UserXattrs: sb.opt.unprivileged,
	}
}

// xattrPrefix is the namespace of the upper's overlay attributes.
func (sb *sandbox) xattrPrefix() string {
	if sb.layersConfig().UserXattrs {
		return "user.overlay."
	}
	return "trusted.overlay."
}

// mountSandbox mounts orig in a fresh sandbox and unmounts it when the
// test ends; a failed test gets a listing of the upper in its log.
func mountSandbox(t testing.TB, orig string, opts ...mountOption) *sandbox {
	t.Helper()
	sb := &sandbox{t: t, orig: orig, log: &syncBuffer{}}
	for _, o := range opts {
		o(&sb.opt)
	}
	sb.state = t.TempDir()
	if sb.opt.stateIn != "" {
		var err error
		if sb.state, err = os.MkdirTemp(sb.opt.stateIn, "state"); err != nil {
			t.Fatal(err)
		}
	}
	sb.upper = filepath.Join(sb.state, "upper")
	sb.work = filepath.Join(sb.state, "work")
	sb.mnt = filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(sb.mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if sb.opt.unprivileged {
		uid, gid := nobodyIDs(t)
		for _, d := range []string{orig, sb.state, sb.mnt} {
			chownTree(t, d, uid, gid)
			openParents(t, d)
		}
		for _, d := range sb.opt.extraLowers {
			chownTree(t, d, uid, gid)
			openParents(t, d)
		}
	}
	registerMount(sb.mnt)
	t.Cleanup(func() { sb.cleanup() })
	sb.start(t)
	return sb
}

func (sb *sandbox) args() (string, []string) {
	var a []string
	if !sb.useStandIn() {
		a = []string{"mount", "--foreground", "--upper", sb.state}
		if sb.opt.allowOther {
			a = append(a, "--allow-other")
		}
		if sb.opt.noPassthrough {
			a = append(a, "--no-passthrough")
		}
		if sb.opt.noIOUring {
			a = append(a, "--no-io-uring")
		}
		if sb.opt.debug {
			a = append(a, "--debug")
		}
		return cliBin, append(a, sb.orig, sb.mnt)
	}
	if sb.opt.allowOther {
		a = append(a, "-allow-other")
	}
	if sb.opt.noPassthrough {
		a = append(a, "-no-passthrough")
	}
	if sb.opt.noIOUring {
		a = append(a, "-no-io-uring")
	}
	for _, l := range sb.opt.extraLowers {
		a = append(a, "-lower", l)
	}
	if sb.opt.timeout != 0 {
		a = append(a, "-timeout", sb.opt.timeout.String())
	}
	return standInBin, append(a, sb.orig, sb.state, sb.mnt)
}

// start runs the server and waits until the mount is live.
func (sb *sandbox) start(t testing.TB) {
	t.Helper()
	bin, args := sb.args()
	cmd := exec.Command(bin, args...)
	sb.mu.Lock()
	sb.runs++
	fmt.Fprintf(sb.log, "=== server run %d: %s %s\n", sb.runs, bin, strings.Join(args, " "))
	sb.mu.Unlock()
	cmd.Stdout, cmd.Stderr = sb.log, sb.log
	cmd.Dir = sb.state
	cmd.Env = childEnv(append([]string{"GOTRACEBACK=all"}, sb.opt.env...)...)
	// Pdeathsig: a test binary killed by a timeout takes its servers (and
	// so their mounts) with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if sb.opt.unprivileged {
		uid, gid := nobodyIDs(t)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
		cmd.Env = append(cmd.Env, "HOME="+sb.state)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start server: %v", err)
	}
	done := make(chan struct{})
	sb.mu.Lock()
	sb.cmd, sb.done = cmd, done
	sb.mu.Unlock()
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(sb.log, "=== server exited: %v\n", err)
		close(done)
	}()
	deadline := time.Now().Add(mountTimeout)
	for {
		if e, ok := mountAt(sb.mnt); ok && e.fstype == "fuse.sbxfs" {
			sb.mu.Lock()
			sb.dev = e.majorMinor
			sb.mu.Unlock()
			break
		}
		select {
		case <-done:
			t.Fatalf("server (%s) exited before mounting %s:\n%s", sb.serverName(), sb.mnt, sb.log.String())
		default:
		}
		if time.Now().After(deadline) {
			sb.forceStop()
			t.Fatalf("%s did not show up as fuse.sbxfs in /proc/self/mountinfo within %v; server output:\n%s",
				sb.mnt, mountTimeout, sb.log.String())
		}
		time.Sleep(time.Millisecond)
	}
	if !sb.opt.mountedOnly {
		sb.waitReady(t, done, deadline)
	}
}

// waitReady waits, once the mount is visible, until the server says it is
// serving: the stand-in prints "ready", the CLI logs "mounted". (The mount
// shows up in mountinfo while go-fuse is still finishing fuse.Mount;
// TestServerSigtermRightAfterMount checks that a SIGTERM in that window is
// handled too.)
func (sb *sandbox) waitReady(t testing.TB, done chan struct{}, deadline time.Time) {
	t.Helper()
	marker := "ready\n"
	if !sb.useStandIn() {
		marker = "msg=mounted"
	}
	for {
		sb.mu.Lock()
		runs := sb.runs
		sb.mu.Unlock()
		out := sb.log.String()
		if i := strings.LastIndex(out, fmt.Sprintf("=== server run %d:", runs)); i >= 0 && strings.Contains(out[i:], marker) {
			return
		}
		select {
		case <-done:
			t.Fatalf("server (%s) exited after mounting %s:\n%s", sb.serverName(), sb.mnt, out)
		default:
		}
		if time.Now().After(deadline) {
			sb.forceStop()
			t.Fatalf("server (%s) did not report %q within %v:\n%s", sb.serverName(), strings.TrimSpace(marker), mountTimeout, out)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (sb *sandbox) running() (*exec.Cmd, chan struct{}) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.cmd == nil {
		return nil, nil
	}
	select {
	case <-sb.done:
		return nil, nil
	default:
	}
	return sb.cmd, sb.done
}

// stop asks the server to unmount and exit (SIGTERM) and waits. It
// returns what went wrong: a server that needed umount(8), a mount left
// behind, or an exit status other than 0.
func (sb *sandbox) stop() error {
	cmd, done := sb.running()
	var problems []string
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		exited := false
		// While the mount is still there, resend SIGTERM now and then: an
		// unmount refused while the kernel was still releasing files is
		// retried on the next signal. Once the mount is gone the server
		// is exiting and is left alone.
		for i := 0; i < 10 && !exited; i++ {
			select {
			case <-done:
				exited = true
			case <-time.After(time.Second):
				if _, ok := mountAt(sb.mnt); ok {
					_ = cmd.Process.Signal(syscall.SIGTERM)
				}
			}
		}
		if !exited {
			problems = append(problems, "server did not exit within 10s of SIGTERM")
			problems = append(problems, sb.forceUnmount()...)
			if !waitDone(done, 5*time.Second) {
				problems = append(problems, sb.killHard(cmd, done)...)
			}
		} else if st := cmd.ProcessState; st != nil && !st.Success() {
			problems = append(problems, "server exited with "+st.String())
		}
	}
	if _, ok := mountAt(sb.mnt); ok {
		problems = append(problems, "still mounted after the server exited")
		problems = append(problems, sb.forceUnmount()...)
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

func waitDone(done chan struct{}, d time.Duration) bool {
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// killHard SIGKILLs the server's process group; a server stuck in the
// kernel on a request to its own mount is freed by aborting the FUSE
// connection.
func (sb *sandbox) killHard(cmd *exec.Cmd, done chan struct{}) []string {
	notes := []string{"server killed with SIGKILL"}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if waitDone(done, 5*time.Second) {
		return notes
	}
	notes = append(notes, fmt.Sprintf("server stuck after SIGKILL (kernel stack: %s)", procStack(cmd.Process.Pid)))
	if err := sb.abortConnection(); err != nil {
		notes = append(notes, "abort FUSE connection: "+err.Error())
	} else {
		notes = append(notes, "FUSE connection aborted")
	}
	if !waitDone(done, 5*time.Second) {
		notes = append(notes, "server still not reaped")
	}
	return notes
}

func procStack(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stack", pid))
	if err != nil {
		return err.Error()
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// abortConnection aborts the FUSE connection of the sandbox's mount
// through fusectl (/sys/fs/fuse/connections/<minor>/abort).
func (sb *sandbox) abortConnection() error {
	sb.mu.Lock()
	dev := sb.dev
	sb.mu.Unlock()
	_, minor, ok := strings.Cut(dev, ":")
	if !ok {
		return errors.New("device of the mount unknown")
	}
	conn := "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(conn, minor)); err != nil {
		_ = exec.Command("mount", "-t", "fusectl", "none", conn).Run()
	}
	return os.WriteFile(filepath.Join(conn, minor, "abort"), []byte("1"), 0o200)
}

// forceUnmount unmounts with umount(8), lazily as a last resort.
func (sb *sandbox) forceUnmount() []string {
	var notes []string
	for _, args := range [][]string{{sb.mnt}, {"-l", sb.mnt}} {
		if _, ok := mountAt(sb.mnt); !ok {
			break
		}
		out, err := runTimeout(10*time.Second, "umount", args...)
		notes = append(notes, fmt.Sprintf("umount %s: %v %s", strings.Join(args, " "), err, bytes.TrimSpace(out)))
	}
	return notes
}

// runTimeout runs a command, killing it after d.
func runTimeout(d time.Duration, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}

// forceStop kills the server and removes its mount, without judging.
func (sb *sandbox) forceStop() {
	if cmd, done := sb.running(); cmd != nil {
		sb.killHard(cmd, done)
	}
	sb.forceUnmount()
}

// kill SIGKILLs the server, leaving a dead mount behind (ENOTCONN).
func (sb *sandbox) kill(t testing.TB) {
	t.Helper()
	cmd, done := sb.running()
	if cmd == nil {
		t.Fatal("kill: no server running")
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitDone(done, 10*time.Second) {
		t.Errorf("server stuck after SIGKILL (kernel stack: %s); aborting its FUSE connection", procStack(cmd.Process.Pid))
		_ = sb.abortConnection()
		waitDone(done, 5*time.Second)
	}
}

func (sb *sandbox) cleanup() {
	t := sb.t
	err := sb.stop()
	out := sb.log.String()
	switch {
	case err != nil:
		t.Errorf("unmount %s: %v\nserver output:\n%s", sb.mnt, err, out)
	case strings.Contains(out, "DATA RACE") || strings.Contains(out, "panic:"):
		t.Errorf("server (%s) reported a race or a panic:\n%s", sb.serverName(), out)
	case !sb.opt.serverErrors && strings.Contains(out, "level=ERROR"):
		t.Errorf("server (%s) logged errors:\n%s", sb.serverName(), out)
	case t.Failed():
		t.Logf("server (%s) output:\n%s", sb.serverName(), out)
	}
	if t.Failed() {
		t.Logf("upper layer %s:\n%s", sb.upper, listUpper(sb.upper))
	}
}

// remount unmounts the sandbox and mounts the same upper again.
func remount(t testing.TB, sb *sandbox) {
	t.Helper()
	if err := sb.stop(); err != nil {
		t.Fatalf("remount: unmount: %v\n%s", err, sb.log.String())
	}
	sb.start(t)
}

// listUpper describes every object of an upper layer: type, mode, owner,
// size, device numbers, symlink target and the attributes sbxfs uses.
func listUpper(upper string) string {
	out, err := exec.Command("find", upper, "-printf", `%y %M %U:%G %s %p%l\n`).CombinedOutput()
	s := string(out)
	if err != nil {
		s += "find: " + err.Error() + "\n"
	}
	x, _ := exec.Command("getfattr", "-R", "-P", "-h", "-d", "-m", "-", "--absolute-names", upper).CombinedOutput()
	s += "xattrs:\n" + string(x)
	if len(s) > 64<<10 {
		s = s[:64<<10] + "\n... (cut)"
	}
	return s
}
