package tests

import (
	"os"
	"regexp"
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

// TestPowerCutKeepsUpperChangesWhoseRecordsWereLost: the power goes
// after the upper's changes reached the disk and before the journal's
// records of them did (the server's journal sync held off; another
// process's fsync on the state's filesystem commits its metadata, the
// upper's renames and whiteouts among it, while the journal's appended
// tail is still in the page cache). Until 2026-11-28 status and commit
// then said nothing had changed, and a commit dropped the changes the
// mount had shown. The server's mark beside the journal, synced before
// it serves, tells the next reader the stop was unclean: status reads
// the journal reconciled with the upper (layers/reconcile.go), and the
// next mount writes those records before it serves.
func TestPowerCutKeepsUpperChangesWhoseRecordsWereLost(t *testing.T) {
	rtNeedCLI(t)
	const opts = "commit=60"
	fs := fsutiltest.MountExt4(t, opts, "-O", "has_journal")
	orig := newOrig(t, map[string]string{"keep": "k\n", "gone": "g\n", "edit": "e\n", "d/x": "x\n", "d/y": "y\n"})
	sb := mountSandbox(t, orig, withStateIn(fs), allowServerErrors(), withServerEnv("SBXFS_JOURNAL_SYNC_EVERY=1h"))
	fsutiltest.Syncfs(t, fs) // the sandbox as mounted is on disk
	if err := os.Rename(sb.path("d"), sb.path("moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sb.path("gone")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sb.path("edit"), []byte("edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sb.path("new"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Another process's fsync on the state's filesystem: its journal
	// commits every metadata change made so far.
	other, err := os.Create(fs + "/other")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Sync(); err != nil {
		t.Fatal(err)
	}
	other.Close()
	fsutiltest.ShutdownExt4(t, fs)
	sb.kill(t)
	sb.forceUnmount()
	fsutiltest.MountExt4Again(t, fs, opts)

	// (An edit whose data the power took may read as a change of
	// metadata alone: "m".)
	want := []string{`(?m)^R d -> moved$`, `(?m)^D gone$`, `(?m)^[Mm] edit$`, `(?m)^A new$`}
	out, err := runTimeout(60e9, cliBin, "status", sb.state)
	if err != nil {
		t.Fatalf("sbxfs status: %v\n%s", err, out)
	}
	for _, w := range want {
		if !regexp.MustCompile(w).Match(out) {
			t.Errorf("after the power cut, sbxfs status lacks %q:\n%s", w, out)
		}
	}
	// The data written and never synced may be lost with the power, as
	// on ext4 itself (a file's size can come back with zeros): the
	// commit must give the original what the upper kept.
	kept := map[string]string{}
	for _, p := range []string{"edit", "new"} {
		b, err := os.ReadFile(sb.upperPath(p))
		if err != nil {
			t.Fatalf("the upper after the power cut: %v", err)
		}
		kept[p] = string(b)
	}
	// Mounted again, the server writes the records; the commit applies
	// them all.
	sb.start(t)
	out, err = runTimeout(60e9, cliBin, "commit", "-m", "after the power cut", sb.mnt)
	if err != nil {
		t.Fatalf("sbxfs commit: %v\n%s", err, out)
	}
	for p, data := range map[string]string{"keep": "k\n", "edit": kept["edit"], "new": kept["new"], "moved/x": "x\n", "moved/y": "y\n"} {
		if b, err := os.ReadFile(orig + "/" + p); err != nil || string(b) != data {
			t.Errorf("after the commit the original's %s holds %q (%v), want %q", p, b, err, data)
		}
	}
	for _, p := range []string{"gone", "d"} {
		if _, err := os.Lstat(orig + "/" + p); !os.IsNotExist(err) {
			t.Errorf("after the commit the original still has %s (%v)", p, err)
		}
	}
}
