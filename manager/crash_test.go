package manager

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The crash tests run a plan commit in a child process (this test binary,
// re-executed) that kills itself with SIGKILL at a named point; the parent
// then opens a new manager on the same state root, whose recovery must
// leave every original all-old (before the plan's commit point) or all-new
// (from it on).
const envChild = "SBXFS_MANAGER_TEST_CHILD"

// childJob is what the parent asks of the child.
type childJob struct {
	Op       string // "commit", "lock" or "signal"
	Root     string
	Plan     string
	Point    string
	Keep     bool
	Original string
}

// TestChild is the child's body; it does nothing in a normal run.
func TestChild(t *testing.T) {
	raw := os.Getenv(envChild)
	if raw == "" {
		t.Skip("runs only as the child of a manager test")
	}
	var job childJob
	require.NoError(t, json.Unmarshal([]byte(raw), &job))
	m, err := New(Options{StateRoot: job.Root, Logger: slog.New(&testHandler{t: t})})
	if job.Op == "lock" {
		if errors.Is(err, ErrLocked) {
			os.Exit(3)
		}
		require.NoError(t, err)
		os.Exit(4)
	}
	require.NoError(t, err)
	_, err = m.CommitPlan(ctx, job.Plan, CommitOptions{Keep: job.Keep, Fault: func(p string) {
		if p == job.Point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}})
	require.NoError(t, err)
	t.Fatalf("the commit passed %s without dying", job.Point)
}

// runChild runs job in a child process and returns how it ended.
func runChild(t *testing.T, job childJob) (syscall.WaitStatus, string) {
	t.Helper()
	raw, err := json.Marshal(job)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChild+"="+string(raw))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the child must not succeed: %s", out)
	return ee.Sys().(syscall.WaitStatus), string(out)
}

var planPoints = []struct {
	point     string
	committed bool
}{
	{"prepared-all", false},
	{"plan-recorded", false},
	{"applied-0", false},
	{"applied-1", false},
	{"applied-2", false},
	{"synced", false},
	{"plan-committed", true},
	{"finished", true},
}

func TestCrashAtEveryPlanPoint(t *testing.T) {
	for _, keep := range []bool{false, true} {
		for _, pp := range planPoints {
			name := pp.point
			if keep {
				name += "/keep"
			}
			t.Run(name, func(t *testing.T) {
				root := t.TempDir()
				m := open(t, root)
				fx := newFixture(t, m, "p", 3)
				require.NoError(t, m.Close())

				ws, out := runChild(t, childJob{Op: "commit", Root: root, Plan: "p", Point: pp.point, Keep: keep})
				require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child dies at %s: %s", pp.point, out)

				m = open(t, root)
				fx.m = m
				if !pp.committed {
					fx.allOld(t)
					assert.Equal(t, repeat(Active, 3), fx.states(t, m), "the sandboxes keep their changes")
					res, err := m.CommitPlan(ctx, "p", CommitOptions{})
					require.NoError(t, err, "and commit again")
					assert.Len(t, res.Committed, 3)
					fx.allNew(t)
					return
				}
				fx.allNew(t)
				if keep {
					assert.Equal(t, repeat(Active, 3), fx.states(t, m))
					sb, _ := m.Get(fx.ids[0])
					ents, _ := os.ReadDir(sb.Upper)
					assert.Empty(t, ents, "kept sandboxes are reset")
				} else {
					assert.Equal(t, repeat(Committed, 3), fx.states(t, m))
				}
				// A kept sandbox is active and empty: committing it again
				// commits nothing; a committed one is not committed twice.
				res, err := m.CommitPlan(ctx, "p", CommitOptions{Keep: keep})
				require.NoError(t, err)
				if !keep {
					assert.Empty(t, res.Committed)
				}
				fx.allNew(t)
				_, err = os.Stat(m.planRecordPath("p"))
				assert.ErrorIs(t, err, os.ErrNotExist)
			})
		}
	}
}

// One manager per state root, across processes.
func TestSecondManagerIsLockedOut(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	_, err := New(Options{StateRoot: root})
	assert.ErrorIs(t, err, ErrLocked, "in this process")
	ws, out := runChild(t, childJob{Op: "lock", Root: root})
	assert.Equal(t, 3, ws.ExitStatus(), "in another process: %s", out)

	require.NoError(t, m.Close())
	m2, err := New(Options{StateRoot: root})
	require.NoError(t, err, "free again after Close")
	require.NoError(t, m2.Close())
}

// A nested plan (unmounted: the child's original is a directory in the
// parent's mountpoint) killed once the child is marked committed into its
// parent: recovery finishes and ends the child, undoes nothing of it, and
// leaves the parent active with its changes and its original all-old.
func TestCrashNestedAfterTheChildsCommitPoint(t *testing.T) {
	for _, point := range []string{"applied-0", "nested-committed-0", "nested-ended-0", "applied-1"} {
		t.Run(point, func(t *testing.T) {
			root := t.TempDir()
			m := open(t, root)
			parentOrig := makeTree(t, map[string]string{"top": "t"})
			parent, err := m.Create(ctx, CreateOptions{Plan: "p", Original: parentOrig})
			require.NoError(t, err)
			inner := filepath.Join(parent.Mountpoint, "inner")
			require.NoError(t, os.Mkdir(inner, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(inner, "c"), []byte("c"), 0o644))
			child, err := m.Create(ctx, CreateOptions{Plan: "p", Original: inner})
			require.NoError(t, err)
			edit(t, m, parent.ID, func(e *editor) { e.write("top", "parent") })
			edit(t, m, child.ID, func(e *editor) { e.write("c", "child") })
			require.NoError(t, m.Close())

			ws, out := runChild(t, childJob{Op: "commit", Root: root, Plan: "p", Point: point})
			require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child dies at %s: %s", point, out)

			m = open(t, root)
			assert.Equal(t, "t", readFile(t, parentOrig, "top"), "the real original is all-old")
			p, err := m.Get(parent.ID)
			require.NoError(t, err)
			assert.Equal(t, Active, p.State)
			c, err := m.Get(child.ID)
			require.NoError(t, err)
			if point == "applied-0" {
				assert.Equal(t, Active, c.State, "not yet committed into its parent: undone")
				assert.Equal(t, "c", readFile(t, inner, "c"))
			} else {
				assert.Equal(t, Committed, c.State, "committed into its parent, after a crash too")
				assert.Equal(t, "child", readFile(t, inner, "c"))
			}
			_, err = os.Stat(m.planRecordPath("p"))
			assert.ErrorIs(t, err, os.ErrNotExist)
			// Keep: the parent's mountpoint (a plain directory here) holds
			// the child's original, so it could not be removed.
			res, err := m.CommitPlan(ctx, "p", CommitOptions{Keep: true})
			require.NoError(t, err)
			assert.Contains(t, res.Committed, parent.ID)
			assert.Equal(t, "parent", readFile(t, parentOrig, "top"))
		})
	}
}
