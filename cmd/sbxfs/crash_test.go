package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
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
