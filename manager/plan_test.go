package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/internal/immutable"
	"github.com/sbxfs/sbxfs/layers"
)

var ctx = context.Background()

func TestCommitPlanAllNew(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 3)
	other := newFixture(t, m, "other", 1)

	res, err := m.CommitPlan(ctx, "p", CommitOptions{Message: "all three"})
	require.NoError(t, err)
	assert.Equal(t, fx.ids, res.Committed, "commit order is creation order")
	assert.Empty(t, res.RolledBack)
	assert.Empty(t, res.RollbackFailed)
	fx.allNew(t)
	assert.Equal(t, repeat(Committed, 3), fx.states(t, m))
	for _, id := range fx.ids {
		sb, _ := m.Get(id)
		for _, d := range []string{sb.Upper, sb.Work, sb.Mountpoint} {
			assert.NoDirExists(t, d, "a committed sandbox leaves nothing behind")
		}
	}
	other.allOld(t)
	assert.Equal(t, []State{Active}, other.states(t, m), "another plan is not touched")
	_, err = os.Stat(m.planRecordPath("p"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the plan record is gone")

	res, err = m.CommitPlan(ctx, "p", CommitOptions{})
	require.NoError(t, err, "nothing left to commit is not an error")
	assert.Empty(t, res.Committed)
}

// A failure in the k-th sandbox, for every k: every original is
// unchanged, every sandbox stays active with its changes, and the same
// plan commits once the cause is fixed (PITFALLS 6, 7).
func TestCommitPlanFailureInEachSandbox(t *testing.T) {
	needRoot(t)
	for k := 0; k < 3; k++ {
		t.Run(fmt.Sprint("k=", k), func(t *testing.T) {
			m := open(t, t.TempDir())
			fx := newFixture(t, m, "p", 3)
			locked := filepath.Join(fx.origs[k], "sub")
			unlock := immutable.Set(t, locked)
			var seen []string
			res, err := m.CommitPlan(ctx, "p", CommitOptions{Fault: func(p string) { seen = append(seen, p) }})
			var pe *PlanError
			require.ErrorAs(t, err, &pe)
			assert.Same(t, res, pe.Result(), "one value: the result is the error")
			assert.ErrorIs(t, err, unix.EPERM)
			assert.Empty(t, res.Committed)
			assert.Equal(t, fx.ids, res.RolledBack)
			assert.Empty(t, res.RollbackFailed)
			fx.allOld(t)
			assert.Equal(t, repeat(Active, 3), fx.states(t, m))
			assert.NotContains(t, seen, "plan-committed")
			for i := 0; i < k; i++ {
				assert.Contains(t, seen, fmt.Sprint("applied-", i), "sandbox %d was applied, then undone", i)
			}

			unlock()
			res, err = m.CommitPlan(ctx, "p", CommitOptions{})
			require.NoError(t, err)
			assert.Equal(t, fx.ids, res.Committed)
			fx.allNew(t)
		})
	}
}

// A process that held an original file open writes to it after the apply
// moved it into the backups: before its commit point the plan sees the
// backup changed (commit.Txn.Sync, which also makes the originals
// durable first), undoes every sandbox, and the write stays.
func TestCommitPlanWriteDuringTheCommit(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 2)
	fd, err := unix.Open(filepath.Join(fx.origs[0], "f"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	var seen []string
	res, err := m.CommitPlan(ctx, "p", CommitOptions{Fault: func(p string) {
		seen = append(seen, p)
		if p == "applied-1" {
			_, werr := unix.Pwrite(fd, []byte("other writer"), 0)
			assert.NoError(t, werr)
		}
	}})
	require.Error(t, err)
	assert.ErrorIs(t, err, commit.ErrConflict)
	assert.Equal(t, CodeConflict, ErrorCode(err))
	assert.Contains(t, err.Error(), "f: changed in the original during the commit")
	assert.Empty(t, res.Committed)
	assert.Equal(t, fx.ids, res.RolledBack)
	assert.NotContains(t, seen, "synced")
	assert.NotContains(t, seen, "plan-committed")
	b, err := os.ReadFile(filepath.Join(fx.origs[0], "f"))
	require.NoError(t, err)
	assert.Equal(t, "other writer", string(b), "the write stays in the original")
	assert.Equal(t, fx.old[1], snapshot(t, fx.origs[1]), "the other original is as before")
	assert.Equal(t, repeat(Active, 2), fx.states(t, m))
}

// An undo that fails is reported as such, the others are still undone
// (PITFALLS 2, 3, 4), and the next commit retries the undo first.
func TestRollbackFailureIsReported(t *testing.T) {
	needRoot(t)
	m := open(t, t.TempDir(), true)
	fx := newFixture(t, m, "p", 3)
	sub0 := filepath.Join(fx.origs[0], "sub")
	sub1 := filepath.Join(fx.origs[1], "sub")
	unlock1 := immutable.Set(t, sub1) // sandbox 1 cannot apply
	unlock0 := func() {}
	fault := func(p string) {
		if p == "applied-0" {
			unlock0 = immutable.Set(t, sub0) // ... and sandbox 0 cannot be undone
		}
	}
	res, err := m.CommitPlan(ctx, "p", CommitOptions{Fault: fault})
	var pe *PlanError
	require.ErrorAs(t, err, &pe)
	assert.Empty(t, res.Committed)
	assert.Equal(t, []string{fx.ids[1], fx.ids[2]}, res.RolledBack)
	require.Len(t, res.RollbackFailed, 1)
	assert.Equal(t, fx.ids[0], res.RollbackFailed[0].ID)
	assert.ErrorIs(t, res.RollbackFailed[0].Err, unix.EPERM)
	var ce *commit.Error
	require.ErrorAs(t, res.RollbackFailed[0].Err, &ce)
	assert.NotEmpty(t, ce.Kept, "the backups are kept and named")
	assert.Contains(t, err.Error(), "ROLLBACK FAILED for "+fx.ids[0])
	assert.Equal(t, fx.old[1], snapshot(t, fx.origs[1]))
	assert.Equal(t, fx.old[2], snapshot(t, fx.origs[2]))
	assert.NotEqual(t, fx.old[0], snapshot(t, fx.origs[0]), "sandbox 0 is partly applied, as reported")
	sb, _ := m.Get(fx.ids[0])
	assert.Equal(t, Active, sb.State)
	assert.Contains(t, sb.Error, "rollback")

	unlock0()
	unlock1()
	res, err = m.CommitPlan(ctx, "p", CommitOptions{})
	require.NoError(t, err)
	assert.Len(t, res.Committed, 3)
	fx.allNew(t)
	sb, _ = m.Get(fx.ids[0])
	assert.Empty(t, sb.Error)
}

// A panic anywhere in the protocol is a failure like any other: the
// applied sandboxes are undone (PITFALLS 1).
func TestPanicIsUndone(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 3)
	res, err := m.CommitPlan(ctx, "p", CommitOptions{Fault: func(p string) {
		if p == "applied-1" {
			panic("boom")
		}
	}})
	var pe *PlanError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, res.Err.Error(), "panic: boom")
	assert.Equal(t, fx.ids, res.RolledBack)
	fx.allOld(t)
	assert.Equal(t, repeat(Active, 3), fx.states(t, m))
	_, err = m.CommitPlan(ctx, "p", CommitOptions{})
	require.NoError(t, err)
	fx.allNew(t)
}

// Every failure has the one shape: a result and the same value as a
// *PlanError (PITFALLS 5).
func TestEveryFailureHasOneShape(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	fx := newFixture(t, m, "p", 2)
	// The original changes underneath sandbox 1: a conflict.
	require.NoError(t, os.WriteFile(filepath.Join(fx.origs[1], "f"), []byte("changed underneath"), 0o644))
	fx.old[1] = snapshot(t, fx.origs[1])
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	closed := open(t, t.TempDir())
	require.NoError(t, closed.Close())

	cases := []struct {
		name string
		run  func() (*PlanResult, error)
		is   error
	}{
		{"conflict", func() (*PlanResult, error) { return m.CommitPlan(ctx, "p", CommitOptions{}) }, commit.ErrConflict},
		{"bad plan name", func() (*PlanResult, error) { return m.CommitPlan(ctx, "../x", CommitOptions{}) }, ErrInvalid},
		{"canceled", func() (*PlanResult, error) { return m.CommitPlan(canceled, "p", CommitOptions{}) }, context.Canceled},
		{"closed", func() (*PlanResult, error) { return closed.CommitPlan(ctx, "p", CommitOptions{}) }, ErrClosed},
		{"unknown sandbox", func() (*PlanResult, error) { return m.Commit(ctx, "0123456789abcdef", CommitOptions{}) }, ErrNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := c.run()
			require.NotNil(t, res)
			var pe *PlanError
			require.ErrorAs(t, err, &pe)
			assert.Same(t, res, pe.Result())
			assert.ErrorIs(t, err, c.is)
			assert.ErrorIs(t, res.Err, c.is)
			assert.Empty(t, res.Committed)
			fx.allOld(t)
		})
	}
	res, err := m.CommitPlan(ctx, "p", CommitOptions{Force: true})
	require.NoError(t, err, "--force applies despite the conflict")
	assert.Len(t, res.Committed, 2)
}

// Keep: committed sandboxes stay active and empty, and commit again;
// rolled back sandboxes with keep are re-used (PITFALLS 16).
func TestKeepAndReuse(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 2)
	res, err := m.CommitPlan(ctx, "p", CommitOptions{Keep: true})
	require.NoError(t, err)
	assert.Len(t, res.Committed, 2)
	fx.allNew(t)
	assert.Equal(t, repeat(Active, 2), fx.states(t, m))
	sb, _ := m.Get(fx.ids[0])
	ents, _ := os.ReadDir(sb.Upper)
	assert.Empty(t, ents, "the upper is empty after a commit with keep")

	edit(t, m, fx.ids[0], func(e *editor) { e.write("f", "second round") })
	_, err = m.Commit(ctx, fx.ids[0], CommitOptions{Keep: true})
	require.NoError(t, err)
	assert.Equal(t, "second round", readFile(t, fx.origs[0], "f"))

	edit(t, m, fx.ids[1], func(e *editor) { e.write("f", "thrown away") })
	br, err := m.Rollback(ctx, fx.ids[1], true)
	require.NoError(t, err)
	assert.Equal(t, []string{fx.ids[1]}, br.Done)
	assert.Equal(t, "new 1", readFile(t, fx.origs[1], "f"), "a rollback leaves the original alone")
	edit(t, m, fx.ids[1], func(e *editor) {
		assert.Equal(t, "new 1", e.read("f"), "the view no longer shows the discarded change")
		e.write("again", "re-used")
	})
	_, err = m.Commit(ctx, fx.ids[1], CommitOptions{})
	require.NoError(t, err)
	assert.Equal(t, "re-used", readFile(t, fx.origs[1], "again"))
	assert.Equal(t, "new 1", readFile(t, fx.origs[1], "f"), "the rolled back change is not committed later")
	sb, _ = m.Get(fx.ids[1])
	assert.Equal(t, Committed, sb.State)
}

func TestRollbackPlan(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 3)
	res, err := m.RollbackPlan(ctx, "p", false)
	require.NoError(t, err)
	assert.Equal(t, fx.ids, res.Done)
	fx.allOld(t)
	assert.Equal(t, repeat(RolledBack, 3), fx.states(t, m))
	for _, id := range fx.ids {
		sb, _ := m.Get(id)
		assert.NoDirExists(t, sb.Upper)
	}
	_, err = m.Rollback(ctx, fx.ids[0], false)
	var be *BatchError
	require.ErrorAs(t, err, &be)
	assert.ErrorIs(t, err, ErrNotActive)
}

func readFile(t testing.TB, dir, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, p))
	require.NoError(t, err)
	return string(b)
}

// A sandbox whose original lies in another sandbox's mountpoint commits
// first: its changes then belong to the parent's view.
func TestNestedCommitsChildFirst(t *testing.T) {
	m := open(t, t.TempDir())
	parentOrig := makeTree(t, map[string]string{"top": "t"})
	parent, err := m.Create(ctx, CreateOptions{Plan: "p", Original: parentOrig})
	require.NoError(t, err)
	// Unmounted here: the parent's mountpoint is a plain directory.
	inner := filepath.Join(parent.Mountpoint, "inner")
	require.NoError(t, os.Mkdir(inner, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(inner, "c"), []byte("c"), 0o644))
	child, err := m.Create(ctx, CreateOptions{Plan: "p", Original: inner})
	require.NoError(t, err)
	_, err = m.Create(ctx, CreateOptions{Plan: "other", Original: inner})
	assert.ErrorIs(t, err, ErrInvalid, "a nested sandbox must be in its parent's plan")
	edit(t, m, parent.ID, func(e *editor) { e.write("top", "parent") })
	edit(t, m, child.ID, func(e *editor) { e.write("c", "child") })

	res, err := m.CommitPlan(ctx, "p", CommitOptions{Keep: true})
	require.NoError(t, err)
	assert.Equal(t, []string{child.ID, parent.ID}, res.Committed, "the child commits before its parent")
	assert.Equal(t, "parent", readFile(t, parentOrig, "top"))
	// What went into an original: the parent's changes; the child's went
	// into the parent.
	require.Len(t, res.Applied, 1)
	assert.Equal(t, parent.ID, res.Applied[0].ID)
	assert.Equal(t, parentOrig, res.Applied[0].Original)
	assert.Equal(t, []layers.Change{{Path: "top", Kind: layers.Modified, Type: "file"}}, res.Applied[0].Changes)
	assert.Equal(t, "child", readFile(t, inner, "c"))
}

// Two sandboxes of one plan that change the same path are refused before
// anything is applied: both would be applied, and one silently lost.
func TestOverlappingChangesAreRefused(t *testing.T) {
	m := open(t, t.TempDir())
	orig := makeTree(t, fixtureFiles)
	old := snapshot(t, orig)
	var ids []string
	for i := 0; i < 2; i++ {
		sb, err := m.Create(ctx, CreateOptions{Plan: "p", Original: orig})
		require.NoError(t, err)
		ids = append(ids, sb.ID)
		edit(t, m, sb.ID, func(e *editor) { e.write("f", fmt.Sprint("writer ", i)) })
	}
	res, err := m.CommitPlan(ctx, "p", CommitOptions{})
	assert.ErrorIs(t, err, ErrOverlap)
	assert.Equal(t, ids, res.RolledBack)
	assert.Equal(t, old, snapshot(t, orig))

	require.NoError(t, m.Destroy(ctx, ids[1]))
	_, err = m.CommitPlan(ctx, "p", CommitOptions{})
	require.NoError(t, err)
	assert.Equal(t, "writer 0", readFile(t, orig, "f"))
}

func TestCommitOneOfAPlan(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 2)
	res, err := m.Commit(ctx, fx.ids[1], CommitOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{fx.ids[1]}, res.Committed)
	assert.Equal(t, "p", res.Plan)
	assert.Equal(t, fx.want(1), snapshot(t, fx.origs[1]))
	assert.Equal(t, fx.old[0], snapshot(t, fx.origs[0]))
	assert.Equal(t, []State{Active, Committed}, fx.states(t, m))
	_, err = m.Commit(ctx, fx.ids[1], CommitOptions{})
	assert.ErrorIs(t, err, ErrNotActive)
	assert.False(t, errors.Is(err, ErrNotFound))
}

// A failure after the commit point cannot undo the commit: the result
// says committed and names the failure; the plan record keeps only the
// unfinished sandbox, and the next operation on the plan completes it.
func TestCleanupFailureAfterTheCommitPoint(t *testing.T) {
	needRoot(t)
	m := open(t, t.TempDir(), true)
	fx := newFixture(t, m, "p", 3)
	stuck := m.upper(fx.ids[1])
	unlock := immutable.Set(t, stuck)
	res, err := m.CommitPlan(ctx, "p", CommitOptions{})
	var pe *PlanError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, err.Error(), "committed, but the cleanup failed")
	assert.Equal(t, fx.ids, res.Committed)
	assert.Empty(t, res.RolledBack)
	fx.allNew(t)
	assert.Equal(t, []State{Committed, Active, Committed}, fx.states(t, m))
	sb, _ := m.Get(fx.ids[1])
	assert.Contains(t, sb.Error, "committed, but ending the sandbox failed")
	pr, err := m.readPlanRecord("p")
	require.NoError(t, err)
	require.NotNil(t, pr)
	assert.Equal(t, planCommitted, pr.State)
	require.Len(t, pr.Txns, 1)
	assert.Equal(t, fx.ids[1], pr.Txns[0].Sandbox)

	unlock()
	res, err = m.CommitPlan(ctx, "p", CommitOptions{})
	require.NoError(t, err)
	assert.Empty(t, res.Committed, "the committed sandbox is ended, not committed again")
	assert.Equal(t, repeat(Committed, 3), fx.states(t, m))
	sb, _ = m.Get(fx.ids[1])
	assert.Empty(t, sb.Error)
	assert.NoDirExists(t, stuck)
	fx.allNew(t)
	pr, err = m.readPlanRecord("p")
	require.NoError(t, err)
	assert.Nil(t, pr)
}

// TestKeptSandboxIsEndedOnce: a plan committed with Keep, one sandbox's
// Finish failing after the commit point (a backup that cannot be removed
// for a moment). That sandbox is reset and kept as the others, and the
// plan record goes on listing it, unfinished; the user works on in it.
// The next operation on the plan finishes the transaction, and must not
// end the sandbox again: until 2026-11-28 it reset it a second time, and
// the new work was lost (found by review). The sandbox record says after
// which commit it was ended.
func TestKeptSandboxIsEndedOnce(t *testing.T) {
	needRoot(t)
	m := open(t, t.TempDir(), true)
	fx := newFixture(t, m, "p", 2)
	var unset func()
	_, err := m.CommitPlan(ctx, "p", CommitOptions{Keep: true, Fault: func(p string) {
		switch p {
		case "plan-committed":
			bs, _ := filepath.Glob(filepath.Join(m.work(fx.ids[1]), "txn-*", "b", "*"))
			require.NotEmpty(t, bs)
			unset = immutable.Set(t, bs[0])
		case "finished":
			unset()
		}
	}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "committed, but the cleanup failed")
	fx.allNew(t)
	sb, _ := m.Get(fx.ids[1])
	assert.Equal(t, Active, sb.State)
	ents, _ := os.ReadDir(sb.Upper)
	assert.Empty(t, ents, "sandbox 1 is reset already, kept")
	pr, err := m.readPlanRecord("p")
	require.NoError(t, err)
	require.NotNil(t, pr, "the plan record lists the unfinished transaction")

	edit(t, m, fx.ids[1], func(e *editor) { e.write("precious", "new work") })
	res, err := m.CommitPlan(ctx, "p", CommitOptions{Keep: true})
	require.NoError(t, err)
	assert.Contains(t, res.Committed, fx.ids[1])
	assert.Equal(t, "new work", readFile(t, fx.origs[1], "precious"), "the new work committed, not reset away")
	pr, err = m.readPlanRecord("p")
	require.NoError(t, err)
	assert.Nil(t, pr)
}

// TestCommitPlanOverHardLinksAcrossOriginals: two originals of a plan
// share a file by hard links; one sandbox replaces its name, the other
// removes its own. The first apply moves the shared inode into its
// backups (its ctime moves): what another sandbox's apply of the same
// plan did is no change by another writer, and the plan commits.
func TestCommitPlanOverHardLinksAcrossOriginals(t *testing.T) {
	m := open(t, t.TempDir())
	o0, o1 := makeTree(t, map[string]string{"f": "old", "k": "k"}), makeTree(t, map[string]string{"k": "k"})
	require.NoError(t, os.Link(filepath.Join(o0, "f"), filepath.Join(o1, "g")))
	var ids []string
	for _, o := range []string{o0, o1} {
		sb, err := m.Create(ctx, CreateOptions{Plan: "p", Original: o})
		require.NoError(t, err)
		ids = append(ids, sb.ID)
	}
	edit(t, m, ids[0], func(e *editor) { e.write("f", "new") })
	edit(t, m, ids[1], func(e *editor) { e.remove("g") })
	res, err := m.CommitPlan(ctx, "p", CommitOptions{})
	require.NoError(t, err)
	assert.Equal(t, ids, res.Committed)
	assert.Equal(t, map[string]string{".": "dir", "f": "new", "k": "k"}, snapshot(t, o0))
	assert.Equal(t, map[string]string{".": "dir", "k": "k"}, snapshot(t, o1))
}

// A plan with a sandbox whose original was moved away commits nothing
// (ErrOriginalMissing, code original_missing: put it back); once it is
// back, the commit goes through.
func TestCommitPlanOriginalMovedAway(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 2)
	away := fx.origs[1] + ".away"
	require.NoError(t, os.Rename(fx.origs[1], away))
	res, err := m.CommitPlan(ctx, "p", CommitOptions{})
	require.ErrorIs(t, err, ErrOriginalMissing)
	assert.Equal(t, CodeOriginalMissing, ErrorCode(err))
	assert.Contains(t, err.Error(), fx.origs[1]+" is not there (moved or removed?): put it back there and retry")
	assert.Empty(t, res.Committed)
	assert.Equal(t, fx.ids, res.RolledBack)
	assert.Equal(t, fx.old[0], snapshot(t, fx.origs[0]), "the other original is as before")
	assert.Equal(t, repeat(Active, 2), fx.states(t, m))

	require.NoError(t, os.Rename(away, fx.origs[1]))
	res, err = m.CommitPlan(ctx, "p", CommitOptions{})
	require.NoError(t, err)
	assert.Len(t, res.Committed, 2)
	fx.allNew(t)
}

// TestMovedOriginal: a sandbox whose original was moved takes its new
// place (Moved): the record and the layers name it, also for the next
// manager, and the plan commits every change there, nothing at the old
// place. Refused, with the records left as they were: the old place still
// a directory (the new one would be another original), a new place that
// is not a directory, or that lies in the state root.
func TestMovedOriginal(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	fx := newFixture(t, m, "p", 2)
	id := fx.ids[1]
	_, err := m.Moved(ctx, id, fx.origs[0])
	require.ErrorIs(t, err, ErrInvalid, "the old place is still there")
	assert.Contains(t, err.Error(), "is still there")

	moved := fx.origs[1] + ".moved"
	require.NoError(t, os.Rename(fx.origs[1], moved))
	for _, bad := range []string{filepath.Join(moved, "f"), moved + ".none", filepath.Join(root, "sandboxes")} {
		_, err := m.Moved(ctx, id, bad)
		require.ErrorIs(t, err, ErrInvalid, bad)
	}
	sb, err := m.Get(id)
	require.NoError(t, err)
	assert.Equal(t, fx.origs[1], sb.Original, "a refusal changes nothing")

	sb, err = m.Moved(ctx, id, moved)
	require.NoError(t, err)
	assert.Equal(t, moved, sb.Original)
	assert.Equal(t, Active, sb.State)
	require.NoError(t, m.Close())
	m = open(t, root)
	sb, err = m.Get(id)
	require.NoError(t, err)
	assert.Equal(t, moved, sb.Original, "the record keeps the new place")
	cfg, err := m.Config(id)
	require.NoError(t, err)
	assert.Equal(t, []string{moved}, cfg.Lowers, "so do the layers")

	res, err := m.CommitPlan(ctx, "p", CommitOptions{})
	require.NoError(t, err)
	assert.Len(t, res.Committed, 2)
	assert.Equal(t, fx.want(0), snapshot(t, fx.origs[0]))
	assert.Equal(t, fx.want(1), snapshot(t, moved))
	_, err = os.Lstat(fx.origs[1])
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing made at the old place")
}
