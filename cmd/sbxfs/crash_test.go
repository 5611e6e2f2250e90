package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/fsutil/fsutiltest"
	"github.com/sbxfs/sbxfs/manager"
)

// The crash tests kill the real daemon (the sbxfs binary) with SIGKILL at
// a named point of a plan commit (SBXFS_FAULT, see cmd_daemon.go), then
// run a managed command, which starts a new daemon: its recovery must
// leave every original all-old (before the plan's commit point) or
// all-new (from it on), and every sandbox in the state docs/manager.md
// gives for that point, mounted again if it is active.

// startFaultyDaemon starts the daemon of e with SBXFS_FAULT=point and
// returns its pid.
func (e *managedEnv) startFaultyDaemon(point string) int {
	e.t.Helper()
	cmd := exec.Command(e.bin, "--state-dir", e.root, "daemon")
	cmd.Env = append(os.Environ(), faultEnv+"="+point)
	out, err := cmd.CombinedOutput()
	require.NoError(e.t, err, "%s", out)
	pid := e.daemonPid()
	require.NotZero(e.t, pid)
	return pid
}

// crashCommit runs commit --plan p (with args) on a daemon that dies in
// it, and waits until that daemon has exited.
func (e *managedEnv) crashCommit(pid int, args ...string) {
	e.t.Helper()
	r := e.sbxfs(append([]string{"commit", "--plan", "p"}, args...)...)
	assertFailure(e.t, r, exitInternal, "went away")
	if !waitProcessExit(pid, 20*time.Second) {
		// Stuck exiting on a request to one of its own mounts: abort them.
		es, err := fsutil.ReadMountinfo()
		require.NoError(e.t, err)
		for _, m := range es {
			if within(m.Mountpoint, e.root) {
				abortFuse(e.t, m.Mountpoint)
			}
		}
		e.t.Fatalf("the killed daemon (pid %d) did not finish exiting", pid)
	}
}

// assertNoPlanRecord checks the plan was settled.
func (e *managedEnv) assertNoPlanRecord() {
	e.t.Helper()
	assert.NoFileExists(e.t, filepath.Join(e.root, "plans", "p.json"), "the plan record is gone once settled")
}

func TestCrashDaemonAtPlanPoints(t *testing.T) {
	t.Parallel()
	points := []struct {
		point     string
		keep      bool
		committed bool
	}{
		{"prepared-all", false, false},
		{"plan-recorded", false, false},
		{"applied-0", false, false},
		{"applied-1", false, false},
		{"synced", false, false},
		{"plan-committed", false, true},
		{"finished", false, true},
		{"applied-1", true, false},
		{"plan-committed", true, true},
		{"finished", true, true},
	}
	for _, pp := range points {
		name := pp.point
		if pp.keep {
			name += "/keep"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newManagedEnv(t)
			pid := e.startFaultyDaemon(pp.point)
			o1, o2 := e.original("o1"), e.original("o2")
			s1, s2 := e.create("--plan", "p", o1), e.create("--plan", "p", o2)
			writeFile(t, filepath.Join(s1.Mountpoint, "a.txt"), "one\n")
			writeFile(t, filepath.Join(s2.Mountpoint, "new"), "two\n")
			var args []string
			if pp.keep {
				args = append(args, "--keep")
			}
			e.crashCommit(pid, args...)

			l := e.list() // a new daemon recovers
			assert.NotEqual(t, pid, e.daemonPid())
			e.assertNoPlanRecord()
			if !pp.committed {
				assertFile(t, filepath.Join(o1, "a.txt"), "hello\n")
				assert.NoFileExists(t, filepath.Join(o2, "new"))
				for _, sb := range []manager.SandboxInfo{s1, s2} {
					assert.Equal(t, manager.Active, l[sb.ID].State, "the sandboxes keep their changes")
					assert.True(t, l[sb.ID].Mounted)
					assert.Empty(t, l[sb.ID].Error)
				}
				assertFile(t, filepath.Join(s1.Mountpoint, "a.txt"), "one\n")
				assertFile(t, filepath.Join(s2.Mountpoint, "new"), "two\n")
				r := e.sbxfs("commit", "--plan", "p")
				require.Equal(t, 0, r.code, r.stderr)
			}
			assertFile(t, filepath.Join(o1, "a.txt"), "one\n")
			assertFile(t, filepath.Join(o2, "new"), "two\n")
			l = e.list()
			for _, sb := range []manager.SandboxInfo{s1, s2} {
				if pp.keep && pp.committed {
					assert.Equal(t, manager.Active, l[sb.ID].State, "kept")
					assert.True(t, l[sb.ID].Mounted)
					assert.Empty(t, names(t, sb.Upper), "and reset")
				} else if pp.committed {
					assert.Equal(t, manager.Committed, l[sb.ID].State)
					assert.False(t, isMounted(t, sb.Mountpoint))
				}
			}
			if pp.keep && pp.committed {
				assertFile(t, filepath.Join(s1.Mountpoint, "a.txt"), "one\n")
			}
			e.assertNoPlanRecord()
		})
	}
}

// A nested plan (sandbox B over sandbox A's mount) killed at each point:
// before B is marked committed into A, all-old and both active with their
// changes; from nested-committed-0 until the plan's commit point, the
// original is all-old, B is committed (into A) and A is active holding
// both sets of changes; from plan-committed on, all-new.
func TestCrashDaemonNestedPlan(t *testing.T) {
	t.Parallel()
	const (
		bothActive = iota // all-old, each sandbox with its own changes
		childDone         // all-old, B committed into A
		allNew
	)
	points := []struct {
		point string
		want  int
	}{
		{"prepared-all", bothActive},
		{"applied-0", bothActive},
		{"nested-committed-0", childDone},
		{"nested-ended-0", childDone},
		{"applied-1", childDone},
		{"plan-committed", allNew},
		{"finished", allNew},
	}
	for _, pp := range points {
		t.Run(pp.point, func(t *testing.T) {
			t.Parallel()
			e := newManagedEnv(t)
			pid := e.startFaultyDaemon(pp.point)
			n := e.nested()
			e.crashCommit(pid)

			l := e.list() // a new daemon recovers
			e.assertNoPlanRecord()
			a, b := l[n.a.ID], l[n.b.ID]
			switch pp.want {
			case bothActive:
				n.assertAllOld(t)
				assert.Equal(t, manager.Active, a.State)
				assert.Equal(t, manager.Active, b.State)
				assert.True(t, b.Mounted)
				assert.Equal(t, []string{"a.txt", "b.txt", "fromA", "gone"}, names(t, n.a.Mountpoint), "B's changes are not in A")
				n.assertAllNew(t, n.b.Mountpoint)
			case childDone:
				n.assertAllOld(t)
				assert.Equal(t, manager.Active, a.State)
				assert.Equal(t, manager.Committed, b.State)
				assert.False(t, isMounted(t, n.b.Mountpoint))
				n.assertAllNew(t, n.a.Mountpoint)
			case allNew:
				n.assertAllNew(t, n.orig)
				assert.Equal(t, manager.Committed, a.State)
				assert.Equal(t, manager.Committed, b.State)
				assert.False(t, isMounted(t, n.a.Mountpoint))
				assert.False(t, isMounted(t, n.b.Mountpoint))
				return
			}
			assert.True(t, a.Mounted)
			assert.Empty(t, a.Error)
			r := e.sbxfs("commit", "--plan", "p")
			require.Equal(t, 0, r.code, r.stderr)
			n.assertAllNew(t, n.orig)
			l = e.list()
			assert.Equal(t, manager.Committed, l[n.a.ID].State)
			assert.Equal(t, manager.Committed, l[n.b.ID].State)
			e.assertNoPlanRecord()
		})
	}
}

// TestPowerCutAfterANestedCommit: the state root (every sandbox's upper
// and journal) is on a filesystem of its own, whose journal commits only
// when asked (commit=60); the original is elsewhere. The daemon dies
// right after the plan record marked B committed into its parent A
// (nested-committed-0), then the power goes. B is committed and ended
// by then, so A must hold B's changes after the power cut: the
// commit into A's mount (staged and renamed through A's server into A's
// upper and journal) must be on disk before the mark, and a syncfs of the
// mount never reaches the server. Until 2026-11-28 B's changes were gone
// from A (found by review); now the plan asks A's server to sync first.
func TestPowerCutAfterANestedCommit(t *testing.T) {
	const opts = "commit=60"
	fs := fsutiltest.MountExt4(t, opts, "-O", "has_journal")
	t.Cleanup(func() { waitUnused(fs) }) // after the daemon stopped, before the unmount
	e := newManagedEnv(t, func(e *managedEnv) { e.root = filepath.Join(fs, "state") })
	pid := e.startFaultyDaemon("nested-committed-0")
	n := e.nested()
	fsutiltest.Syncfs(t, fs) // the sandboxes' work is on disk before the commit
	e.crashCommit(pid)
	es, err := fsutil.ReadMountinfo()
	require.NoError(t, err)
	for _, m := range es {
		if within(m.Mountpoint, e.root) {
			abortFuse(t, m.Mountpoint)
			require.NoError(t, unix.Unmount(m.Mountpoint, unix.MNT_DETACH))
		}
	}
	fsutiltest.PowerCutExt4(t, fs, opts)

	l := e.list() // a new daemon recovers
	assert.Equal(t, manager.Committed, l[n.b.ID].State)
	n.assertAllNew(t, n.a.Mountpoint)
	r := e.sbxfs("commit", "--plan", "p")
	require.Equal(t, 0, r.code, r.stderr)
	n.assertAllNew(t, n.orig)
}

// waitUnused waits (up to 10 s) until no process has a file or its
// working directory under dir: a killed daemon may still be exiting.
func waitUnused(dir string) {
	for range 100 {
		busy := false
		ps, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range ps {
			if l, _ := os.Readlink(p + "/cwd"); within(l, dir) {
				busy = true
			}
			fds, _ := filepath.Glob(p + "/fd/*")
			for _, fd := range fds {
				if l, _ := os.Readlink(fd); within(l, dir) {
					busy = true
				}
			}
		}
		if !busy {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
