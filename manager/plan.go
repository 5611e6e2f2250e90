package manager

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// CommitOptions tune a plan commit.
type CommitOptions struct {
	Message string        // kept in each sandbox's undo log
	Force   bool          // apply despite conflicts
	Wait    time.Duration // how long a freeze waits for files open for writing to close
	Keep    bool          // committed sandboxes stay (mounted), empty, instead of going away
	// Fault, when set, is called at the named points of the plan protocol
	// (tests kill the process or panic there): "prepared-all",
	// "plan-recorded", "applied-<k>" (after the k-th sandbox, from 0, in
	// commit order), with nested sandboxes "nested-committed-<level>" and
	// "nested-ended-<level>" (from 0), then "plan-committed", "finished".
	Fault func(point string)
}

// participant is one sandbox in a plan commit.
type participant struct {
	rec      record
	cfg      layers.Config
	index    int // in commit order
	ctl      controller
	closeCtl func()
	frozen   bool
	txn      *commit.Txn
	failed   error // its undo failed
	// nested: its original lies in another participant's mountpoint. It
	// is committed into that parent at the end of its level (done), before
	// the parent is frozen and prepared: its transaction directory lives in
	// the parent's mount until it is finished, and must be gone from the
	// parent's change set and never be removed through a frozen mount.
	nested     bool
	done       bool // committed into its parent (the plan record says so)
	unfinished bool // done, but finishing or ending it failed
	// stillMounted: committed, but its mount was busy: kept, reset.
	stillMounted bool
}

// planCommit is one run of the plan commit protocol (docs/manager.md).
type planCommit struct {
	m      *Manager
	opt    CommitOptions
	res    *PlanResult
	levels [][]*participant // children's level first; each level prepares, then applies
	parts  []*participant   // commit order: the levels, concatenated
	record planRecord
	// applied is what the applies did to the originals' inodes, shared
	// by every transaction: originals may share files by hard links.
	applied *commit.Applied
}

// CommitPlan commits every active sandbox of plan, all or nothing: on any
// failure every applied sandbox is undone, in reverse order, and every
// sandbox stays active with its changes, so the commit can be retried.
// It holds the plan's lock throughout. Every outcome comes as one
// *PlanResult; on failure the error is the same value as a *PlanError.
func (m *Manager) CommitPlan(ctx context.Context, plan string, o CommitOptions) (*PlanResult, error) {
	leave, err := m.enter()
	if err != nil {
		return (&PlanResult{Plan: plan, Err: err}).finish()
	}
	defer leave()
	return m.commitPlan(ctx, plan, "", o)
}

// Commit commits the one sandbox id, as a plan of one, under its plan's
// lock.
func (m *Manager) Commit(ctx context.Context, id string, o CommitOptions) (*PlanResult, error) {
	leave, err := m.enter()
	if err != nil {
		return (&PlanResult{Err: err}).finish()
	}
	defer leave()
	r, ok := m.get(id)
	if !ok {
		return (&PlanResult{Err: fmt.Errorf("%w: %s", ErrNotFound, id)}).finish()
	}
	return m.commitPlan(ctx, r.Plan, id, o)
}

func (m *Manager) commitPlan(ctx context.Context, plan, only string, o CommitOptions) (*PlanResult, error) {
	if f, inner := m.opt.Fault, o.Fault; f != nil {
		o.Fault = func(point string) {
			f(point)
			if inner != nil {
				inner(point)
			}
		}
	}
	res := &PlanResult{Plan: plan}
	unlock, err := m.lockPlan(ctx, plan)
	if err != nil {
		res.Err = err
		return res.finish()
	}
	defer unlock()
	if err := m.settlePlan(plan); err != nil {
		res.Err = fmt.Errorf("an earlier commit of the plan is unsettled: %w", err)
		return res.finish()
	}
	if r, ok := m.get(only); ok && !o.Keep {
		// Committed alone and ended, it would take its nested sandboxes'
		// original away.
		if err := m.nestedActive(&r); err != nil {
			res.Err = err
			return res.finish()
		}
	}
	c := &planCommit{m: m, opt: o, res: res, record: planRecord{Plan: plan, State: planPrepared, Keep: o.Keep}, applied: commit.NewApplied()}
	if err := c.enlist(only); err != nil {
		res.Err = err
		return res.finish()
	}
	if len(c.parts) == 0 {
		return res.finish()
	}
	start := time.Now()
	c.run(ctx)
	m.log.Info("plan commit", "plan", plan, "committed", res.Committed, "unchanged", res.RolledBack,
		"rollback_failed", len(res.RollbackFailed), "err", res.Err, "took", since(start))
	return res.finish()
}

// enlist gathers the plan's active sandboxes (or only the one named) in
// commit order: nested sandboxes before their parents.
func (c *planCommit) enlist(only string) error {
	var act []record
	rs := c.m.snapshot(c.record.Plan)
	if len(rs) == 0 && only == "" {
		return noPlan(c.record.Plan)
	}
	for _, r := range rs {
		switch {
		case only != "" && r.ID != only:
		case r.State == Active:
			act = append(act, r)
		case only != "":
			return fmt.Errorf("%w: sandbox %s is %s", ErrNotActive, r.ID, r.State)
		}
	}
	levels, err := commitLevels(act)
	if err != nil {
		return err
	}
	for _, lv := range levels {
		var ps []*participant
		for _, r := range lv {
			cfg, err := c.m.layersConfig(r.ID)
			if err != nil {
				return err
			}
			p := &participant{rec: r, cfg: cfg, index: len(c.parts), closeCtl: func() {}}
			ps = append(ps, p)
			c.parts = append(c.parts, p)
		}
		c.levels = append(c.levels, ps)
	}
	for _, p := range c.parts {
		for _, q := range c.parts {
			if nestedIn(&p.rec, &q.rec) {
				p.nested = true
			}
		}
	}
	return nil
}

func (c *planCommit) run(ctx context.Context) {
	defer c.release()
	if err := c.applyAll(ctx); err != nil {
		c.abort(err)
		return
	}
	if err := c.syncAll(); err != nil {
		c.abort(err)
		return
	}
	if !c.commitPoint() {
		return
	}
	c.finish(c.fault("plan-committed"))
}

// applyAll runs each level: freeze and prepare its sandboxes, record the
// plan, apply them in order. Nothing is undone here.
func (c *planCommit) applyAll(ctx context.Context) error {
	for level, lv := range c.levels {
		for _, p := range lv {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := safely(func() error { return c.prepare(p) }); err != nil {
				return fmt.Errorf("prepare sandbox %s: %w", p.rec.ID, err)
			}
		}
		if err := safely(func() error { return checkOverlaps(c.parts) }); err != nil {
			return err
		}
		if err := c.fault("prepared-all"); err != nil {
			return err
		}
		if err := c.m.writePlanRecord(&c.record); err != nil {
			return err
		}
		if err := c.fault("plan-recorded"); err != nil {
			return err
		}
		for _, p := range lv {
			if err := safely(p.txn.Apply); err != nil {
				return fmt.Errorf("apply sandbox %s: %w", p.rec.ID, err)
			}
			if err := c.fault(fmt.Sprintf("applied-%d", p.index)); err != nil {
				return err
			}
		}
		if err := c.commitNested(lv, level); err != nil {
			return err
		}
	}
	return nil
}

// commitNested commits the nested sandboxes of a level into their
// parents' mounts, before the next level freezes and prepares the
// parents: the plan record marks them done (their commit point: from here
// on they are committed, after a crash too), then each transaction is
// finished (its transaction directory, in the parent's mount, removed)
// and the sandbox ended as after a commit, and the record forgets them.
// The real originals are not touched: they change only with the plan's
// commit point. Fault points "nested-committed-<level>" (after the mark)
// and "nested-ended-<level>".
func (c *planCommit) commitNested(lv []*participant, level int) error {
	var ns []*participant
	for _, p := range lv {
		if p.nested && p.txn != nil {
			ns = append(ns, p)
		}
	}
	if len(ns) == 0 {
		return nil
	}
	// As syncAll does for the others before the plan's commit point: what
	// the apply moved into the backups must be as it was (a process
	// writing through the parent's mount, which is not frozen yet, to a
	// file the child replaces), else the plan is undone. Until 2026-11-28
	// the check came only after the mark, its conflict was dropped, and
	// the write went with the backups (found by review).
	for _, p := range ns {
		if err := safely(p.txn.Sync); err != nil {
			return fmt.Errorf("sandbox %s: %w", p.rec.ID, err)
		}
	}
	if err := c.syncParents(ns); err != nil {
		return err
	}
	for _, p := range ns {
		c.record.markDone(p.rec.ID, true)
	}
	if err := c.m.writePlanRecord(&c.record); err != nil {
		// The record may or may not say done now. Remove it: then undo is
		// right (the sandboxes' undo logs are not marked committed). If even
		// that fails, go on as if it said done: finishing them is right
		// whatever the disk says (without the mark, recovery still undoes
		// them until their transactions are finished).
		rerr := c.m.removePlanRecord(c.record.Plan)
		if rerr == nil {
			for _, p := range ns {
				c.record.markDone(p.rec.ID, false)
			}
			return err
		}
		c.m.log.Error("the plan record could be neither written nor withdrawn; committing the nested sandboxes into their parents anyway",
			"plan", c.record.Plan, "err", err, "remove_err", rerr)
	}
	for _, p := range ns {
		p.done = true
	}
	failed := c.fault(fmt.Sprintf("nested-committed-%d", level))
	var errs []error
	var ended []string
	for _, p := range ns {
		_ = safely(p.txn.MarkCommitted) // the plan record decides
		err := safely(p.txn.Finish)
		p.txn = nil
		if err == nil {
			err = safely(func() error { return c.m.afterCommit(p, c.opt.Keep, c.record.txnOf(p.rec.ID)) })
		}
		if p.stillMounted {
			c.res.StillMounted = append(c.res.StillMounted, p.rec.ID)
		}
		if err != nil {
			p.unfinished = true
			errs = append(errs, fmt.Errorf("sandbox %s: %w", p.rec.ID, err))
			c.m.note(&p.rec, "committed into its parent, but ending the sandbox failed (retried by the next operation on the plan): "+err.Error())
			continue
		}
		ended = append(ended, p.rec.ID)
	}
	c.record.drop(ended)
	if err := c.m.writePlanRecord(&c.record); err != nil {
		c.m.log.Warn("the plan record still lists nested sandboxes already ended", "plan", c.record.Plan, "err", err)
	}
	if failed == nil {
		failed = c.fault(fmt.Sprintf("nested-ended-%d", level))
	}
	if failed != nil {
		errs = append(errs, failed)
	}
	if len(errs) > 0 {
		return fmt.Errorf("nested sandboxes committed into their parents, then: %w", errors.Join(errs...))
	}
	return nil
}

// prepare freezes p when someone serves it and prepares its transaction.
func (c *planCommit) prepare(p *participant) error {
	if err := originalThere(&p.rec); err != nil {
		return err
	}
	ctl, closeCtl, err := c.m.controller(&p.rec)
	if err != nil {
		return err
	}
	p.ctl, p.closeCtl = ctl, closeCtl
	if ctl != nil {
		if err := ctl.Freeze(c.opt.Wait); err != nil {
			return err
		}
		p.frozen = true
	}
	x, err := commit.Prepare(p.cfg, commit.Options{Message: c.opt.Message, Force: c.opt.Force, Applied: c.applied})
	if err != nil {
		return err
	}
	p.txn = x
	c.record.Txns = append(c.record.Txns, planTxn{Sandbox: p.rec.ID, Txn: x.ID()})
	return nil
}

// fault calls the test hook; a panic there is a failure like any other.
func (c *planCommit) fault(point string) error {
	if c.opt.Fault == nil {
		return nil
	}
	return safely(func() error { c.opt.Fault(point); return nil })
}

// safely runs f and turns a panic into an error (PITFALLS 1): a failure
// of any kind must reach the undo.
func safely(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v\n%s", v, debug.Stack())
		}
	}()
	return f()
}

// abort undoes every prepared or applied transaction in reverse commit
// order, going on past a failed undo, and sorts the sandboxes into
// rolled back (original as before) and rollback failed.
func (c *planCommit) abort(cause error) {
	c.res.Err = cause
	for i := len(c.parts) - 1; i >= 0; i-- {
		p := c.parts[i]
		if p.txn == nil {
			continue
		}
		c.thawAround(p)
		if err := safely(p.txn.Undo); err != nil {
			p.failed = err
			c.m.stuckTxn(p.rec.ID, p.txn)
		}
		p.txn = nil
	}
	var unfinished []string
	for _, p := range c.parts {
		switch {
		case p.done:
			c.res.Committed = append(c.res.Committed, p.rec.ID)
			if p.unfinished {
				unfinished = append(unfinished, p.rec.ID)
			}
		case p.failed != nil:
			c.res.RollbackFailed = append(c.res.RollbackFailed, Failure{ID: p.rec.ID, Err: p.failed})
			c.m.note(&p.rec, "rollback after a failed plan commit failed: "+p.failed.Error())
		default:
			c.res.RolledBack = append(c.res.RolledBack, p.rec.ID)
		}
	}
	if len(c.res.RollbackFailed) == 0 {
		// Only nested sandboxes committed into their parents and not yet
		// ended stay listed (done): the next operation on the plan ends them.
		if err := c.m.narrowPlanRecord(&c.record, unfinished); err != nil {
			c.m.log.Warn("the prepared plan record stays", "plan", c.record.Plan, "err", err)
		}
	}
}

// thawAround thaws the sandboxes whose mount holds p's original: p's undo
// writes through them.
func (c *planCommit) thawAround(p *participant) {
	for _, q := range c.parts {
		if q.frozen && within(p.rec.Original, q.rec.Mountpoint) {
			q.ctl.Thaw()
			q.frozen = false
		}
	}
}

// release thaws what is still frozen and closes the control connections.
func (c *planCommit) release() {
	for _, p := range c.parts {
		if p.frozen {
			p.ctl.Thaw()
			p.frozen = false
		}
		p.closeCtl()
	}
}

// syncParents has the server of every parent of the nested sandboxes ns
// make its upper and journal durable: their commits wrote into the
// parents' mounts, and Txn.Sync's syncfs of a mount does not reach its
// server. Until 2026-11-28 nothing did before the done mark: a power cut
// then left the nested sandboxes committed and ended, and their changes
// gone from their parents (found by review).
func (c *planCommit) syncParents(ns []*participant) error {
	for _, q := range c.parts {
		if !slices.ContainsFunc(ns, func(p *participant) bool { return nestedIn(&p.rec, &q.rec) }) {
			continue
		}
		ctl, closeCtl, err := c.m.controller(&q.rec)
		if err == nil && ctl != nil {
			err = ctl.Sync()
		}
		if closeCtl != nil {
			closeCtl()
		}
		if err != nil {
			return fmt.Errorf("sandbox %s: make what its nested sandboxes committed into it durable: %w", q.rec.ID, err)
		}
	}
	return nil
}

// syncAll makes every applied transaction durable in its original and
// checks that nobody wrote to what it backed up (commit.Txn.Sync), before
// the commit point: the plan record must never say committed while an
// original's renames could still be lost to a crash (the record and the
// originals may be on different filesystems). Fault point "synced".
func (c *planCommit) syncAll() error {
	// Every original synced first, then every check: a check made before
	// the others' syncs (seconds, on a busy disk) would leave a write to
	// its backups in the meantime unseen until after the commit point.
	for _, step := range []func(*commit.Txn) error{(*commit.Txn).SyncOriginal, (*commit.Txn).CheckBackups} {
		for _, p := range c.parts {
			if p.txn == nil || p.done {
				continue
			}
			if err := safely(func() error { return step(p.txn) }); err != nil {
				return fmt.Errorf("sandbox %s: %w", p.rec.ID, err)
			}
		}
	}
	return c.fault("synced")
}

// commitPoint rewrites the plan record as committed: from here on the
// plan is committed for every sandbox, after a crash too. It reports
// whether the point was reached; if not, the plan is aborted.
func (c *planCommit) commitPoint() bool {
	c.record.State = planCommitted
	err := c.m.writePlanRecord(&c.record)
	if err == nil {
		return true
	}
	// The record may or may not say committed now. Remove it: then undo is
	// right. If even that fails, recovery must decide from what is on disk.
	if rerr := c.m.removePlanRecord(c.record.Plan); rerr != nil {
		c.res.Err = fmt.Errorf("the plan's commit point could not be written (%v) nor withdrawn (%v): restart the manager; its recovery decides for every sandbox", err, rerr)
		for _, p := range c.parts {
			c.res.RollbackFailed = append(c.res.RollbackFailed, Failure{ID: p.rec.ID, Err: ErrInterrupted})
		}
		return false
	}
	c.record.State = planPrepared
	c.abort(err)
	return false
}

// finish ends every transaction after the commit point and ends each
// sandbox (reset and kept, or unmounted and removed). A failure here
// cannot undo the commit: it is reported, and the plan record stays so
// the next operation on the plan (or recovery) completes the work. failed
// is a failure at the commit point's fault hook, if any.
func (c *planCommit) finish(failed error) {
	var errs []error
	if failed != nil {
		errs = append(errs, failed)
	}
	var unfinished []string
	for _, p := range c.parts {
		c.res.Committed = append(c.res.Committed, p.rec.ID)
		if p.done { // committed into its parent already
			if p.unfinished {
				unfinished = append(unfinished, p.rec.ID)
			}
			continue
		}
		c.res.Applied = append(c.res.Applied, Applied{ID: p.rec.ID, Original: p.rec.Original, Changes: p.txn.Changes()})
		_ = safely(p.txn.MarkCommitted) // the plan record decides; this only helps a lone reader of the undo log
		if err := safely(p.txn.Finish); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", p.rec.ID, err))
			unfinished = append(unfinished, p.rec.ID)
		}
	}
	if err := c.fault("finished"); err != nil {
		errs = append(errs, err)
	}
	for _, p := range c.parts {
		if p.done {
			continue
		}
		err := safely(func() error { return c.m.afterCommit(p, c.opt.Keep, c.record.txnOf(p.rec.ID)) })
		if p.stillMounted {
			c.res.StillMounted = append(c.res.StillMounted, p.rec.ID)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", p.rec.ID, err))
			unfinished = append(unfinished, p.rec.ID)
			c.m.note(&p.rec, "committed, but ending the sandbox failed (retried by the next operation on the plan): "+err.Error())
		}
	}
	if err := c.m.narrowPlanRecord(&c.record, unfinished); err != nil {
		c.m.log.Warn("the committed plan record could not be updated; the next operation on the plan does it", "plan", c.record.Plan, "err", err)
	}
	if len(errs) > 0 {
		c.res.Err = fmt.Errorf("committed, but the cleanup failed (the next operation on the plan retries it): %w", errors.Join(errs...))
	}
}
