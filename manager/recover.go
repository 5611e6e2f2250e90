package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
)

// recoverAll settles every plan with a plan record or a sandbox holding an
// undo log: each plan's originals end all-old or all-new.
func (m *Manager) recoverAll() {
	plans := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(m.root, "plans", "*.json"))
	for _, f := range files {
		plans[strings.TrimSuffix(filepath.Base(f), ".json")] = true
	}
	for _, r := range m.snapshot("") {
		if r.State == Active && hasUndoLog(m.work(r.ID)) {
			plans[r.Plan] = true
		}
	}
	names := make([]string, 0, len(plans))
	for p := range plans {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, plan := range names {
		if checkPlan(plan) != nil {
			m.log.Error("ignoring a plan record with a bad name", "plan", plan)
			continue
		}
		unlock, err := m.lockPlan(context.Background(), plan)
		if err != nil {
			m.log.Error("cannot recover the plan", "plan", plan, "err", err)
			continue
		}
		if err := m.settlePlan(plan); err != nil {
			m.log.Error("the plan's interrupted commit could not be recovered; its undo logs and backups are kept", "plan", plan, "err", err)
		}
		unlock()
	}
}

// settlePlan brings an interrupted or half-cleaned commit of plan to its
// end, under the plan's lock: every transaction is finished or undone as
// the plan record decides, a committed plan's sandboxes are ended as the
// commit would have, then the plan record goes. Parents are recovered
// before the sandboxes nested in them (the reverse of commit order).
func (m *Manager) settlePlan(plan string) error {
	pr, err := m.readPlanRecord(plan)
	if err != nil {
		return err
	}
	var act []record
	for _, r := range m.snapshot(plan) {
		if r.State == Active {
			act = append(act, r)
		}
	}
	order, err := commitOrder(act)
	if err != nil {
		return err
	}
	var errs []error
	var unfinished []string // what the plan record must go on listing
	for i := len(order) - 1; i >= 0; i-- {
		if err := m.recoverSandbox(&order[i], pr); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", order[i].ID, err))
			unfinished = append(unfinished, order[i].ID)
		}
	}
	if pr != nil {
		for i := range order {
			r := &order[i]
			txn := pr.txnOf(r.ID)
			if !pr.committed(r.ID) || hasUndoLog(m.work(r.ID)) || txn != "" && r.Ended == txn {
				continue // not committed, or ended after this commit already
			}
			p := &participant{rec: *r, closeCtl: func() {}}
			if err := m.afterCommit(p, pr.Keep, txn); err != nil {
				errs = append(errs, fmt.Errorf("sandbox %s: end after the commit: %w", r.ID, err))
				unfinished = append(unfinished, r.ID)
			}
		}
	}
	if pr != nil && len(errs) == 0 {
		m.log.Info("plan settled", "plan", plan, "state", pr.State)
	}
	if err := m.narrowPlanRecord(pr, unfinished); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// narrowPlanRecord rewrites pr to list only the sandboxes in ids (whose
// transaction or cleanup is unfinished), or removes it when there are
// none: a sandbox already ended must not be ended twice (a kept one may
// hold new work by then).
func (m *Manager) narrowPlanRecord(pr *planRecord, ids []string) error {
	if pr == nil {
		return nil
	}
	var keep []planTxn
	for _, t := range pr.Txns {
		if slices.Contains(ids, t.Sandbox) {
			keep = append(keep, t)
		}
	}
	if len(keep) == 0 {
		return m.removePlanRecord(pr.Plan)
	}
	if len(keep) == len(pr.Txns) {
		return nil
	}
	pr.Txns = keep
	return m.writePlanRecord(pr)
}

// recoverSandbox finishes or undoes r's interrupted commit: a transaction
// whose undo failed in this process is undone again; one found on disk
// goes to commit.Recover, which the plan record decides.
func (m *Manager) recoverSandbox(r *record, pr *planRecord) error {
	unlock := m.lockRegistry()
	x := m.stuck[r.ID]
	unlock()
	if x != nil {
		if err := x.Undo(); err != nil {
			return fmt.Errorf("%w: undo again: %v", ErrInterrupted, err)
		}
		m.unstick(r.ID)
		m.note(r, "")
		return nil
	}
	if !hasUndoLog(m.work(r.ID)) {
		return nil
	}
	if m.opt.Mount {
		m.mountParents(r)
	}
	cfg, err := m.layersConfig(r.ID)
	if err != nil {
		return err
	}
	rec, err := commit.Recover(cfg, commit.RecoverOptions{Decide: pr.decide})
	if err != nil {
		m.note(r, "recovery of an interrupted commit failed: "+err.Error())
		return fmt.Errorf("%w: %v", ErrInterrupted, err)
	}
	m.log.Info("interrupted commit recovered", "sandbox", r.ID, "txn", rec.ID, "action", rec.Action)
	m.note(r, "")
	return nil
}

// mountParents mounts the active sandboxes whose mount holds r's original,
// their own parents first (after a crash, before r's recovery writes
// through them).
func (m *Manager) mountParents(r *record) {
	for _, o := range m.snapshot("") {
		if o.State == Active && nestedIn(r, &o) && m.mountOf(o.ID) == nil {
			m.mountParents(&o)
			if err := m.detachStale(&o, true); err != nil {
				m.log.Warn("a stale mount could not be detached", "sandbox", o.ID, "err", err)
			}
			if err := m.mountSandbox(&o); err != nil {
				m.log.Error("cannot mount a parent sandbox for recovery", "sandbox", o.ID, "err", err)
			}
		}
	}
}

// afterCommit ends a committed sandbox: with keep it is reset (empty upper
// and journal) and stays active; else it is unmounted, its directories
// are removed and it is committed. A busy mount that cannot be unmounted
// is kept, reset, as with keep.
func (m *Manager) afterCommit(p *participant, keep bool, txn string) (err error) {
	r := &p.rec
	was := r.Ended
	defer func() {
		if err != nil {
			r.Ended = was // not ended: the next operation on the plan does it
		}
	}()
	if !keep {
		// A busy mount stays frozen through the failed unmount, so no
		// change lands between the commit and the reset below.
		err := m.unmountSandbox(r, false)
		if err == nil {
			p.frozen = false
			if err := m.purgeDirs(r); err != nil {
				return err
			}
			r.Error, r.Ended = "", txn
			return m.moveSave(r, Committed)
		}
		m.log.Warn("committed, but the mount is busy: it stays mounted with an empty sandbox", "sandbox", r.ID, "err", err)
		p.stillMounted = true
	}
	if err := m.reset(p); err != nil {
		return err
	}
	if err := r.move(Committed); err != nil {
		return err
	}
	r.Error, r.Ended = "", txn
	return m.moveSave(r, Active)
}

// reset empties a sandbox's upper and journal: through its server when
// someone serves it (frozen while it resets), else on disk.
func (m *Manager) reset(p *participant) error {
	if p.ctl == nil {
		ctl, closeCtl, err := m.controller(&p.rec)
		if err != nil {
			return err
		}
		defer closeCtl()
		p.ctl = ctl
	}
	// An undo before this commit left its restored signatures; they do not
	// describe the new original.
	if err := commit.ForgetBases(m.work(p.rec.ID)); err != nil {
		return err
	}
	if p.ctl == nil {
		if err := fsutil.EmptyDir(m.upper(p.rec.ID)); err != nil {
			return fmt.Errorf("empty the upper: %w", err)
		}
		err := os.Remove(filepath.Join(m.work(p.rec.ID), "journal"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	if !p.frozen {
		if err := p.ctl.Freeze(0); err != nil {
			return err
		}
		p.frozen = true
	}
	err := p.ctl.Reset()
	p.ctl.Thaw()
	p.frozen = false
	return err
}

// moveSave moves r to state to and saves it.
func (m *Manager) moveSave(r *record, to State) error {
	if err := r.move(to); err != nil {
		return err
	}
	return m.save(r)
}

// note records msg ("" clears it) as what r's last operation left behind.
func (m *Manager) note(r *record, msg string) {
	if r.Error == msg {
		return
	}
	r.Error = msg
	if err := m.save(r); err != nil {
		m.log.Error("cannot update the sandbox record", "sandbox", r.ID, "err", err)
	}
}

// stuckTxn keeps a transaction whose undo failed: it holds the sandbox's
// commit lock, so only it can retry the undo in this process.
func (m *Manager) stuckTxn(id string, x *commit.Txn) {
	unlock := m.lockRegistry()
	m.stuck[id] = x
	unlock()
}

func (m *Manager) unstick(id string) {
	unlock := m.lockRegistry()
	delete(m.stuck, id)
	unlock()
}
