package tests

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil/fsutiltest"
)

// TestPowerCutAfterSyncedWrites: the sandbox's upper and journal are on
// a filesystem of their own whose journal commits only when asked
// (commit=60). Through the mount a new file is written with O_SYNC and
// an original file appended to with O_DSYNC; then the power goes. Both
// writes are in the sandbox after it (the kernel synced them), so both
// must be in its change set: through FUSE passthrough no fsync reaches
// the server, and until 2026-11-28 the journal records of the creation
// and the copy-up were not on disk: `sbxfs status` said no changes and a
// commit would have dropped them (found by a power-cut probe). The open
// now makes the journal durable.
func TestPowerCutAfterSyncedWrites(t *testing.T) {
	rtNeedCLI(t)
	const opts = "commit=60"
	fs := fsutiltest.MountExt4(t, opts, "-O", "has_journal")
	orig := newOrig(t, map[string]string{"a": "a\n", "b": "b\n"})
	sb := mountSandbox(t, orig, withStateIn(fs), allowServerErrors())
	fsutiltest.Syncfs(t, fs) // the sandbox as mounted is on disk
	for _, w := range []struct {
		name  string
		flags int
		data  string
	}{{"new", os.O_CREATE | os.O_WRONLY | unix.O_SYNC, "synced\n"}, {"a", os.O_WRONLY | os.O_APPEND | unix.O_DSYNC, "more\n"}} {
		f, err := os.OpenFile(sb.path(w.name), w.flags, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(w.data); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	fsutiltest.ShutdownExt4(t, fs)
	sb.kill(t)
	sb.forceUnmount()
	fsutiltest.MountExt4Again(t, fs, opts)

	out, err := runTimeout(60e9, cliBin, "status", sb.state)
	if err != nil {
		t.Fatalf("sbxfs status: %v\n%s", err, out)
	}
	for _, want := range []string{"A new", "M a"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("after the power cut, sbxfs status lacks %q:\n%s", want, out)
		}
	}
}
