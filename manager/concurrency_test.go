package manager

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests below fail if the per-plan lock is removed (checked by hand:
// with lockPlan reduced to returning a no-op unlock, each of them fails;
// see docs/manager.md). Run them with -race.

// Two commits of one plan at once: exactly one commits, the other waits
// and finds nothing left; no error from a half-seen state, no double
// apply. Without the plan lock the second one prepares sandboxes the
// first is committing and fails (their commit locks are taken).
func TestTwoCommitsOfOnePlan(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 3)
	var applied atomic.Int32
	inside := make(chan struct{})
	first := CommitOptions{Fault: func(p string) {
		switch p {
		case "plan-recorded":
			close(inside)
			time.Sleep(150 * time.Millisecond) // the other commit starts meanwhile
		case "applied-0", "applied-1", "applied-2":
			applied.Add(1)
		}
	}}
	var res [2]*PlanResult
	var errs [2]error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); res[0], errs[0] = m.CommitPlan(ctx, "p", first) }()
	go func() {
		defer wg.Done()
		<-inside
		res[1], errs[1] = m.CommitPlan(ctx, "p", CommitOptions{Fault: func(p string) {
			if len(p) > 8 && p[:8] == "applied-" {
				applied.Add(1)
			}
		}})
	}()
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, fx.ids, res[0].Committed)
	assert.Empty(t, res[1].Committed, "the second commit finds nothing left")
	assert.EqualValues(t, 3, applied.Load(), "each sandbox is applied once")
	fx.allNew(t)
}

// Create and Destroy in a plan wait for its commit: the plan's membership
// cannot change in the middle (PITFALLS 8). Without the plan lock the
// Destroy runs during the commit (and fails, or breaks the commit).
func TestMembershipIsFixedDuringACommit(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 3)
	var destroyed, created atomic.Bool
	done := make(chan error, 2)
	var newID atomic.Value
	fault := func(p string) {
		if p != "plan-recorded" {
			return
		}
		go func() { done <- m.Destroy(ctx, fx.ids[1]); destroyed.Store(true) }()
		go func() {
			sb, err := m.Create(ctx, CreateOptions{Plan: "p", Original: makeTree(t, nil)})
			newID.Store(sb.ID)
			created.Store(true)
			done <- err
		}()
		time.Sleep(200 * time.Millisecond)
		assert.False(t, destroyed.Load(), "Destroy waits for the commit")
		assert.False(t, created.Load(), "Create waits for the commit")
	}
	res, err := m.CommitPlan(ctx, "p", CommitOptions{Fault: fault})
	require.NoError(t, err)
	assert.Equal(t, fx.ids, res.Committed)
	fx.allNew(t)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	sb, _ := m.Get(fx.ids[1])
	assert.Equal(t, CleanedUp, sb.State, "destroyed after its commit")
	sb, _ = m.Get(newID.Load().(string))
	assert.Equal(t, Active, sb.State, "created after the commit, not part of it")
}

// Eight plans commit in parallel (no global lock serialises them), each
// raced by a second commit of the same plan (exactly one commits each).
func TestPlansInParallel(t *testing.T) {
	m := open(t, t.TempDir())
	const n = 8
	fxs := make([]*fixture, n)
	for i := range fxs {
		fxs[i] = newFixture(t, m, fmt.Sprint("plan", i), 3)
	}
	var arrived atomic.Int32
	all := make(chan struct{})
	var closeAll sync.Once
	var together atomic.Bool
	barrier := func(p string) {
		if p != "plan-recorded" {
			return
		}
		if arrived.Add(1) == n {
			closeAll.Do(func() { close(all) })
		}
		select {
		case <-all:
			together.Store(true)
		case <-time.After(10 * time.Second):
		}
	}
	type outcome struct {
		res *PlanResult
		err error
	}
	out := make([][2]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := m.CommitPlan(ctx, fmt.Sprint("plan", i), CommitOptions{Fault: barrier})
				out[i][j] = outcome{res, err}
			}()
		}
	}
	wg.Wait()
	assert.True(t, together.Load(), "the eight plans were inside their commits at once")
	assert.EqualValues(t, n, arrived.Load(), "one commit per plan reached its plan record")
	for i, o := range out {
		require.NoError(t, o[0].err)
		require.NoError(t, o[1].err)
		assert.Equal(t, 3, len(o[0].res.Committed)+len(o[1].res.Committed), "plan %d commits once", i)
		assert.True(t, len(o[0].res.Committed) == 0 || len(o[1].res.Committed) == 0, "plan %d", i)
		fxs[i].allNew(t)
	}
}

// A stress run: commits, creates, destroys, rollbacks and GC of one plan
// at once. Invariants: no unexpected error, each sandbox is committed at
// most once, and each original is all-old or all-new, all-new only if its
// sandbox was committed.
func TestPlanStress(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 12)
	committedBy := sync.Map{} // id -> count
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failures atomic.Int32
	fail := func(what string, err error) {
		if err != nil {
			failures.Add(1)
			t.Errorf("%s: %v", what, err)
		}
	}
	loop := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					f()
				}
			}
		}()
	}
	for range 3 {
		loop(func() {
			time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond) // let the others in first, at times
			res, err := m.CommitPlan(ctx, "p", CommitOptions{})
			fail("commit", err)
			for _, id := range res.Committed {
				v, _ := committedBy.LoadOrStore(id, new(atomic.Int32))
				v.(*atomic.Int32).Add(1)
			}
		})
	}
	loop(func() {
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		fail("destroy", m.Destroy(ctx, fx.ids[rand.IntN(len(fx.ids))]))
	})
	loop(func() {
		_, err := m.Create(ctx, CreateOptions{Plan: "p", Original: makeTree(t, nil)})
		fail("create", err)
	})
	loop(func() { _, err := m.GC(ctx); fail("gc", err) })
	loop(func() {
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		_, err := m.RollbackPlan(ctx, "p", true)
		fail("rollback", err)
	})
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	checkStress(t, fx, &committedBy)
}

// checkStress checks the stress run's invariants on every original.
func checkStress(t *testing.T, fx *fixture, committedBy *sync.Map) {
	changed := 0
	for i, id := range fx.ids {
		v, committed := committedBy.Load(id)
		if committed {
			assert.EqualValues(t, 1, v.(*atomic.Int32).Load(), "sandbox %s committed once", id)
		}
		// A sandbox rolled back (with keep) before its commit commits
		// nothing: all-old. Never anything in between.
		got := snapshot(t, fx.origs[i])
		if committed && !assert.ObjectsAreEqual(fx.old[i], got) {
			changed++
			assert.Equal(t, fx.want(i), got, "committed: all-new")
		} else {
			assert.Equal(t, fx.old[i], got, "not committed: all-old")
		}
	}
	t.Logf("%d of %d changed sandboxes committed their changes", changed, len(fx.ids))
}

// The checker catches a lock taken out of order, whether or not it would
// deadlock this time.
func TestLockOrderChecker(t *testing.T) {
	m := open(t, t.TempDir())
	unlock := m.lockRegistry()
	assert.PanicsWithValue(t, "sbxfs manager: lock order violated: taking the plan lock while holding the registry lock (held: [registry])",
		func() { _, _ = m.lockPlan(ctx, "p") })
	unlock()

	unlockP, err := m.lockPlan(ctx, "p")
	require.NoError(t, err)
	assert.Panics(t, func() { _, _ = m.lockPlan(ctx, "q") }, "two plan locks at once")
	assert.Panics(t, func() { _, _ = m.enter() }, "the life lock after a plan lock")
	unlockP()

	leave, err := m.enter()
	require.NoError(t, err)
	unlockP, err = m.lockPlan(ctx, "p")
	require.NoError(t, err, "life, then plan: in order")
	unlockR := m.lockRegistry()
	unlockR()
	unlockP()
	leave()
}
