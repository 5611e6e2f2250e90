package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// populatedOriginal is an original with files, directories and a symlink
// around the names posixtest uses, so its tests run in a merged root
// directory with lower entries. None of the names collide with posixtest's.
var populatedOriginal = map[string]string{
	"README.md":               "readme\n",
	"go.mod":                  "module example.com/x\n",
	"lib/main.go":             "package main\n",
	"lib/pkg/util.go":         "package pkg\n",
	"lib/pkg/deep/nested.txt": "nested\n",
	"docs/guide.md":           strings.Repeat("guide ", 1000),
	"emptydir/":               "",
	"ws/":                     "",
	"readme.link":             "->README.md",
}

func sortedPosixTests() []string {
	var names []string
	for n := range posixtest.All {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// TestPosix runs go-fuse's POSIX suite against sbxfs mounts, each test on a
// fresh mount: over an empty original, and over a populated one (the
// original must come out unchanged).
func TestPosix(t *testing.T) {
	for _, variant := range []string{"empty", "populated"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			for _, name := range sortedPosixTests() {
				fn := posixtest.All[name]
				t.Run(name, func(t *testing.T) {
					skipIfNotPOSIX(t, name)
					t.Cleanup(func() {
						if t.Skipped() {
							failIfGap(t, name, "see its skip message above")
						}
					})
					var orig string
					if variant == "empty" {
						orig = newOrig(t, nil)
					} else {
						orig = newOrig(t, populatedOriginal)
						originalGuard(t, orig)
					}
					sb := mountSandbox(t, orig)
					dir := sb.mnt
					if variant == "populated" && (name == "ReadDirBasic" || name == "Tmpfile") {
						// ReadDirBasic and Tmpfile want the directory to
						// hold exactly the files they made: run them in an
						// empty original directory beneath the populated root.
						dir = sb.path("emptydir")
					}
					fn(t, dir)
				})
			}
		})
	}
}

// TestPosixUnprivileged runs the suite on mounts served by nobody (through
// fusermount3). Without user_allow_other in /etc/fuse.conf such a mount
// is usable by nobody only, so the suite runs in a copy of this test binary
// executed as nobody (TestPosixChild).
func TestPosixUnprivileged(t *testing.T) {
	if _, err := os.Stat("/usr/bin/fusermount3"); err != nil {
		if _, err := os.Stat("/bin/fusermount3"); err != nil {
			t.Skip("fusermount3 is not installed: an unprivileged server cannot mount")
		}
	}
	bin := testBinaryCopy(t)
	for _, variant := range []string{"empty", "populated"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			for _, name := range sortedPosixTests() {
				t.Run(name, func(t *testing.T) {
					skipIfNotPOSIX(t, name)
					var orig string
					if variant == "empty" {
						orig = newOrig(t, nil)
					} else {
						orig = newOrig(t, populatedOriginal)
					}
					sb := mountSandbox(t, orig, asNobody())
					if variant == "populated" {
						originalGuard(t, orig) // after the chown to nobody
					}
					dir := sb.mnt
					if variant == "populated" && (name == "ReadDirBasic" || name == "Tmpfile") {
						dir = sb.path("emptydir")
					}
					runPosixAsNobody(t, bin, name, dir, sb.state)
				})
			}
		})
	}
}

func runPosixAsNobody(t *testing.T, bin, name, dir, home string) {
	t.Helper()
	cmd := nobodyCmd(t, bin, "-test.run=^TestPosixChild$", "-test.v", "-test.count=1")
	cmd.Env = childEnv(envChildMnt+"="+dir, envChildTest+"="+name, "HOME="+home, "TMPDIR="+home)
	out, err := cmd.CombinedOutput()
	s := string(out)
	switch {
	case err != nil:
		t.Errorf("posixtest %s as nobody: %v\n%s", name, err, s)
	case strings.Contains(s, "--- SKIP: TestPosixChild/"):
		why := goLines(s)
		failIfGap(t, name, why)
		t.Skipf("posixtest %s skipped itself: %s", name, why)
	case !strings.Contains(s, "--- PASS: TestPosixChild/"+name):
		t.Errorf("posixtest %s as nobody did not run:\n%s", name, s)
	default:
		t.Log(strings.TrimSpace(s))
	}
}

// TestPosixChild is the part of TestPosixUnprivileged that runs as nobody,
// in a re-executed test binary.
func TestPosixChild(t *testing.T) {
	mnt, name := os.Getenv(envChildMnt), os.Getenv(envChildTest)
	if mnt == "" {
		t.Skip("helper of TestPosixUnprivileged: runs only in the re-executed test binary")
	}
	fn, ok := posixtest.All[name]
	if !ok {
		t.Fatalf("no posixtest %q", name)
	}
	t.Run(name, func(t *testing.T) { fn(t, filepath.Clean(mnt)) })
}

// beyondPOSIX lists posixtest entries that check behaviour a plain Linux
// filesystem does not have. Such an entry is skipped only when it also
// fails on a plain directory of the test machine (the baseline).
var beyondPOSIX = map[string]string{
	"FcntlFlockLocksFile": "it expects a read lock through a second open file of the same process " +
		"to conflict with a write lock through the first; POSIX record locks belong to the process, " +
		"so they never conflict within one (only filesystems that implement FUSE locks themselves, " +
		"like go-fuse's loopback, pass it)",
}

var baselines sync.Map // posixtest name -> *baselineResult

type baselineResult struct {
	once   sync.Once
	passed bool
	out    string
}

// skipIfNotPOSIX skips a beyondPOSIX entry that a plain directory fails.
func skipIfNotPOSIX(t *testing.T, name string) {
	t.Helper()
	reason, ok := beyondPOSIX[name]
	if !ok {
		return
	}
	b := baseline(t, name)
	if b.passed {
		return // the plain filesystem passes it: so must sbxfs
	}
	t.Skipf("not a POSIX requirement: %s. A plain directory of this machine fails it the same way: %s",
		reason, goLines(b.out))
}

func baseline(t *testing.T, name string) *baselineResult {
	v, _ := baselines.LoadOrStore(name, &baselineResult{})
	b := v.(*baselineResult)
	b.once.Do(func() { b.passed, b.out = runPosixBaseline(t, name) })
	return b
}

// failIfGap fails a posixtest entry that skipped itself on sbxfs (for a
// feature it found missing) but passes on a plain directory of this
// machine: the kernel has the feature, sbxfs lacks it.
func failIfGap(t *testing.T, name, why string) {
	t.Helper()
	if b := baseline(t, name); b.passed {
		t.Errorf("posixtest %s skipped itself on sbxfs (%s), but passes on a plain directory of this machine: "+
			"the kernel supports what it needs, sbxfs does not", name, strings.TrimSpace(why))
	}
}

// runPosixBaseline runs one posixtest entry on a plain directory, in a
// re-executed test binary (a failure must not fail this test).
func runPosixBaseline(t *testing.T, name string) (bool, string) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(self, "-test.run=^TestPosixChild$", "-test.v", "-test.count=1")
	cmd.Env = childEnv(envChildMnt+"="+dir, envChildTest+"="+name)
	out, err := cmd.CombinedOutput()
	return err == nil && strings.Contains(string(out), "--- PASS: TestPosixChild/"+name), string(out)
}

// goLines keeps the "file.go:N: message" lines of a test's output.
func goLines(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, ".go:") {
			keep = append(keep, strings.TrimSpace(l))
		}
	}
	return strings.Join(keep, "; ")
}
