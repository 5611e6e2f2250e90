package commit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// RecoverOptions tune Recover.
type RecoverOptions struct {
	// Decide, when set, overrides the undo log's own state for a
	// transaction that is part of a plan: it reports whether the plan
	// committed (known false: use the log's state).
	Decide func(id string) (committed, known bool)
	// Fault is called at the named points of recovery (tests).
	Fault func(point string)
}

// Recovery says what Recover did.
type Recovery struct {
	ID     string `json:"id"`
	Action string `json:"action"` // "none", "undone" (all-old) or "finished" (all-new)
}

// Recover brings an interrupted commit of the sandbox cfg to an end: one
// that had not reached its commit point is undone (the original is as
// before, the sandbox keeps its changes), one that had is finished (the
// backups are dropped).
func Recover(cfg layers.Config, opt RecoverOptions) (Recovery, error) {
	if err := fsutil.NeedProc(); err != nil {
		return Recovery{}, &Error{Stage: StageRecover, Err: err}
	}
	lock, err := lockSandbox(cfg.Work)
	if err != nil {
		return Recovery{}, &Error{Stage: StageRecover, Err: err}
	}
	defer func() {
		if lock >= 0 {
			unix.Close(lock)
		}
	}()
	l, err := readUndoLog(cfg.Work)
	if errors.Is(err, os.ErrNotExist) {
		cleanStale(cfg, "")
		return Recovery{Action: "none"}, nil
	}
	if err != nil {
		return Recovery{}, &Error{Stage: StageRecover, Err: err}
	}
	if l.Original != cfg.Lowers[0] {
		return Recovery{}, &Error{Stage: StageRecover, Err: errors.New("undo log names another original: " + l.Original)}
	}
	if l.Txn != txnDirFor(cfg, l.ID, true) && l.Txn != txnDirFor(cfg, l.ID, false) {
		// A damaged or planted log: its directory is the one thing
		// recovery moves files out of and removes.
		return Recovery{}, &Error{Stage: StageRecover, Err: fmt.Errorf("undo log names a transaction directory %q that is not this sandbox's (%s); the log is damaged: move %s away and check the original by hand",
			l.Txn, txnDirFor(cfg, l.ID, true), filepath.Join(cfg.Work, UndoLogName))}
	}
	committed := l.State == stateCommitted
	if opt.Decide != nil {
		if c, known := opt.Decide(l.ID); known {
			committed = c
		}
	}
	x := &Txn{cfg: cfg, work: cfg.Work, log: *l, opt: Options{Fault: opt.Fault}, lock: lock, reached: -1}
	lock = -1 // x.close releases it
	if x.orig, err = openTree(l.Original); err != nil {
		return Recovery{}, &Error{Stage: StageRecover, Err: err}
	}
	x.orig.layout = cfg.LayoutXattr
	x.txn, err = openTxnDir(l.Txn)
	if err == nil {
		x.txn.layout = cfg.LayoutXattr
	}
	if err != nil {
		x.close()
		if !errors.Is(err, os.ErrNotExist) {
			return Recovery{}, &Error{Stage: StageRecover, Err: err}
		}
		// No transaction directory: nothing was staged or it is all gone.
		return Recovery{ID: l.ID, Action: "finished"}, removeUndoLog(cfg.Work)
	}
	if committed {
		return Recovery{ID: l.ID, Action: "finished"}, x.Finish()
	}
	if err := x.Undo(); err != nil {
		return Recovery{ID: l.ID, Action: "undo failed"}, err
	}
	return Recovery{ID: l.ID, Action: "undone"}, nil
}
