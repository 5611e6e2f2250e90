package tests

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Running things as nobody, and helper processes.

var nobody struct {
	once     sync.Once
	uid, gid uint32
	err      error
}

func nobodyIDs(t testing.TB) (uint32, uint32) {
	t.Helper()
	nobody.once.Do(func() {
		u, err := user.Lookup("nobody")
		if err != nil {
			nobody.err = err
			return
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		nobody.uid, nobody.gid = uint32(uid), uint32(gid)
	})
	if nobody.err != nil {
		t.Skipf("no user nobody: %v", nobody.err)
	}
	return nobody.uid, nobody.gid
}

// chownTree gives root and everything beneath it (symlinks themselves,
// trees deeper than PATH_MAX too) to uid:gid.
func chownTree(t testing.TB, root string, uid, gid uint32) {
	t.Helper()
	out, err := exec.Command("chown", "-R", "-h", fmt.Sprintf("%d:%d", uid, gid), root).CombinedOutput()
	if err != nil {
		t.Fatalf("chown -R %s: %v %s", root, err, out)
	}
}

// openParents makes the directories above p (up to /tmp) traversable by
// everyone: t.TempDir makes them 0700.
func openParents(t testing.TB, p string) {
	t.Helper()
	tmp := filepath.Clean(os.TempDir())
	for d := filepath.Dir(p); d != tmp && d != "/" && d != "."; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&0o011 != 0o011 {
			if err := os.Chmod(d, os.FileMode(st.Mode&0o777|0o711)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// nobodyCmd returns a command that runs as nobody.
func nobodyCmd(t testing.TB, name string, args ...string) *exec.Cmd {
	uid, gid := nobodyIDs(t)
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	cmd.Dir = "/"
	return cmd
}

// testBinaryCopy returns a copy of this test binary that nobody can run.
func testBinaryCopy(t testing.TB) string {
	t.Helper()
	testBinMu.Lock()
	defer testBinMu.Unlock()
	if testBinCopy != "" {
		return testBinCopy
	}
	dst := filepath.Join(binDir, "tests.test")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	testBinCopy = dst
	return dst
}

// helperCmd re-executes this test binary to run a helper (see runHelper).
func helperCmd(t testing.TB, helper string, args ...string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = childEnv(envHelper + "=" + helper)
	return cmd
}

// childEnv is the environment of a child process: ours, without the 1s
// sleep a race-enabled binary takes at exit, plus extra.
func childEnv(extra ...string) []string {
	return append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), extra...)
}

// runHelper runs in a re-executed test binary: small actions a test needs
// from a second process. The exit status is the answer.
func runHelper(name string, args []string) int {
	switch name {
	case "fcntl-trylock": // args: path; exit 0 = locked, 3 = EAGAIN/EACCES
		fd, err := unix.Open(args[0], unix.O_RDWR, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
		err = unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES):
			return 3
		}
		fmt.Fprintln(os.Stderr, err)
		return 1
	case "fcntl-getlk": // args: path; prints the type of the conflicting lock
		fd, err := unix.Open(args[0], unix.O_RDONLY, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
		if err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("%d %d\n", lk.Type, lk.Pid)
		return 0
	}
	if h, ok := extraHelpers[name]; ok {
		return h(args)
	}
	fmt.Fprintln(os.Stderr, "unknown helper", name)
	return 2
}

// extraHelpers are helpers other test files add (in an init function):
// name -> the helper, run with the arguments of helperCmd; its result is
// the exit status.
var extraHelpers = map[string]func(args []string) int{}

// Small tools.

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// errnoOf reduces err to its errno (0 for nil; -1 when it has none).
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return ^syscall.Errno(0)
}

func errnoName(e syscall.Errno) string {
	switch e {
	case 0:
		return "ok"
	case ^syscall.Errno(0):
		return "non-errno error"
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return e.Error()
}

// writeTree makes files from a map of relative path -> content; a path
// ending in "/" is a directory, content "->target" makes a symlink.
func writeTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	slices.Sort(keys) // parents before children
	for _, k := range keys {
		p := filepath.Join(root, k)
		v := files[k]
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(k, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(v, "->"):
			err = os.Symlink(v[2:], p)
		default:
			err = os.WriteFile(p, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// newOrig makes an original directory (mode 0755) filled by writeTree.
func newOrig(t testing.TB, files map[string]string) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "orig")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	writeTree(t, d, files)
	return d
}

func mustRead(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func lstat(t testing.TB, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return st
}
