// Package immutable makes files and directories immutable (chattr +i) for
// tests: an immutable directory makes a commit fail there with EPERM, as a
// user's file system can.
package immutable

import (
	"os"
	"os/exec"
	"testing"
)

// Set makes p immutable and returns what makes it mutable again (also run
// at cleanup). It skips the test where that cannot be done: not root, or
// a file system without the attribute.
func Set(t testing.TB, p string) (unset func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chattr +i needs root")
	}
	if out, err := exec.Command("chattr", "+i", p).CombinedOutput(); err != nil {
		t.Skipf("chattr +i is not supported here: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", p).Run() })
	return func() {
		t.Helper()
		if out, err := exec.Command("chattr", "-i", p).CombinedOutput(); err != nil {
			t.Fatalf("chattr -i %s: %v %s", p, err, out)
		}
	}
}
