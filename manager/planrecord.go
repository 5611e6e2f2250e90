package manager

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sbxfs/sbxfs/fsutil"
)

// planRecordVersion is the version of the plan record this code writes.
const planRecordVersion = 1

// The states of a plan record. The record is written "prepared" before
// the first original is touched and rewritten "committed" at the plan's
// commit point; recovery finishes the plan's transactions iff it says
// "committed" and lists them, and undoes them otherwise.
const (
	planPrepared  = "prepared"
	planCommitted = "committed"
)

// planRecord is StateRoot/plans/<plan>.json (see docs/manager.md).
type planRecord struct {
	Version int       `json:"version"`
	Plan    string    `json:"plan"`
	State   string    `json:"state"`
	Keep    bool      `json:"keep,omitempty"` // the committed sandboxes stay, reset, instead of going away
	Time    time.Time `json:"time"`
	Txns    []planTxn `json:"txns"`
}

// planTxn is one sandbox's transaction in a plan commit. Done marks a
// nested sandbox committed into its parent's mount at the end of its
// level, before the plan's commit point: it is committed whatever the
// plan's state (see docs/manager.md, nesting).
type planTxn struct {
	Sandbox string `json:"sandbox"`
	Txn     string `json:"txn"`
	Done    bool   `json:"done,omitempty"`
}

// ErrDamagedPlanRecord marks a plan record this code cannot trust: the
// plan's interrupted commits are left alone until it is repaired.
var ErrDamagedPlanRecord = errors.New("damaged plan record")

func (m *Manager) planRecordPath(plan string) string {
	return filepath.Join(m.root, "plans", plan+".json")
}

// writePlanRecord stores p durably (temp file, fsync, rename, fsync dir).
func (m *Manager) writePlanRecord(p *planRecord) error {
	p.Version = planRecordVersion
	p.Time = time.Now().UTC()
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(m.planRecordPath(p.Plan), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write the plan record: %w", err)
	}
	return nil
}

// readPlanRecord reads the record of plan; nil when there is none.
func (m *Manager) readPlanRecord(plan string) (*planRecord, error) {
	b, err := os.ReadFile(m.planRecordPath(plan))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the plan record: %w", err)
	}
	return decodePlanRecord(b, plan)
}

func decodePlanRecord(b []byte, plan string) (*planRecord, error) {
	var p planRecord
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrDamagedPlanRecord, plan, err)
	}
	switch {
	case p.Version < 1 || p.Version > planRecordVersion:
		return nil, fmt.Errorf("%w %s: version %d", ErrDamagedPlanRecord, plan, p.Version)
	case p.Plan != plan:
		return nil, fmt.Errorf("%w %s: names plan %q", ErrDamagedPlanRecord, plan, p.Plan)
	case p.State != planPrepared && p.State != planCommitted:
		return nil, fmt.Errorf("%w %s: state %q", ErrDamagedPlanRecord, plan, p.State)
	}
	for _, t := range p.Txns {
		if !validID(t.Sandbox) || t.Txn == "" {
			return nil, fmt.Errorf("%w %s: bad entry %+v", ErrDamagedPlanRecord, plan, t)
		}
	}
	return &p, nil
}

// removePlanRecord removes the record of plan durably; a missing one is
// fine.
func (m *Manager) removePlanRecord(plan string) error {
	err := os.Remove(m.planRecordPath(plan))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove the plan record: %w", err)
	}
	return fsutil.SyncDir(filepath.Join(m.root, "plans"))
}

// decide answers commit.RecoverOptions.Decide for the plan: a transaction
// the record lists is committed iff the record says so (the plan is
// committed, or the transaction is marked done); one it does not list is
// left to its own undo log (a manager never marks an undo log committed
// before its plan record is).
func (p *planRecord) decide(txn string) (committed, known bool) {
	if p == nil {
		return false, false
	}
	for _, t := range p.Txns {
		if t.Txn == txn {
			return p.State == planCommitted || t.Done, true
		}
	}
	return false, false
}

// committed reports whether the record names sandbox id as committed:
// listed in a committed plan, or marked done.
// txnOf is the transaction of sandbox id in the plan commit ("" if none).
func (p *planRecord) txnOf(id string) string {
	for _, t := range p.Txns {
		if t.Sandbox == id {
			return t.Txn
		}
	}
	return ""
}

func (p *planRecord) committed(id string) bool {
	if p == nil {
		return false
	}
	for _, t := range p.Txns {
		if t.Sandbox == id {
			return p.State == planCommitted || t.Done
		}
	}
	return false
}

// markDone marks the transaction of sandbox id done.
func (p *planRecord) markDone(id string, done bool) {
	for i := range p.Txns {
		if p.Txns[i].Sandbox == id {
			p.Txns[i].Done = done
		}
	}
}

// drop removes the sandboxes ids from the record.
func (p *planRecord) drop(ids []string) {
	p.Txns = slices.DeleteFunc(p.Txns, func(t planTxn) bool { return slices.Contains(ids, t.Sandbox) })
}
