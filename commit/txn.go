package commit

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// Options of a commit.
type Options struct {
	Message string // stored in the commit record
	Force   bool   // apply despite conflicts
	// Fault, when set, is called at each named point of the protocol
	// (tests kill the process there). See FaultPoints.
	Fault func(point string)
	// Applied, when set, is shared with the other transactions of a
	// plan, applied one after the other: what one apply did to an inode
	// hard-linked into another original is then no change by another
	// writer to the others. Nil: this transaction's own.
	Applied *Applied
}

// FaultPoints are the named points between the steps of a commit and of
// its recovery, in order.
var FaultPoints = []string{"planned", "held", "checked", "staging", "staged", "prepared", "applying", "applied", "committed", "cleaned"}

// RecoveryFaultPoints are the named points inside an undo.
var RecoveryFaultPoints = []string{"undoing"}

// Txn is the commit of one sandbox in progress.
type Txn struct {
	cfg     layers.Config
	work    string
	opt     Options
	log     undoLog
	orig    *tree
	txn     *tree
	changes []layers.Change
	lock    int // flock on work/commit.lock, -1 when not held
	// restored are the backups an undo put back, with their signatures.
	restored []restoredObj
	// backups are the original objects the apply moved into the
	// transaction directory, as they were then (Sync checks nobody
	// wrote to them since).
	backups []backupObj
	// held is what the original held right after the conflict check
	// where the apply backs up, by backup slot (held.go).
	held map[string]held
	own  ownState // what the apply's own steps left on original inodes
	// reached is the number of steps this process's Apply began (Undo
	// skips the rest: 0 when Apply never ran, say in a plan whose
	// earlier sandbox failed), or -1 for a transaction recovered after a
	// crash (Undo then undoes every step, checking each).
	reached int
	r       *renames // of changes, made on first use
}

// backupObj is an original object an apply moved from path to slot.
type backupObj struct{ path, slot string }

// restoredObj is an original object an undo moved back to path (moved: a
// renamed directory moved aside first, at its original path).
type restoredObj struct {
	path  string
	moved bool
	sig   layers.Signature
	// untouched: nobody changed it while it was in the backups (as far
	// as this process knows: ownState.untouched).
	untouched bool
}

// lockSandbox takes the sandbox's commit lock: one commit, rollback or
// recovery of a sandbox at a time, across processes.
func lockSandbox(work string) (int, error) {
	fd, err := unix.Open(filepath.Join(work, "commit.lock"), unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("another commit or recovery of this sandbox is running: %w", ErrBusy)
	}
	return fd, nil
}

// ErrInterrupted says an earlier commit of this sandbox did not finish.
var ErrInterrupted = errors.New("an earlier commit of this sandbox was interrupted; run sbxfs recover")

// Prepare computes the change set of the sandbox cfg, checks it against
// the original, stages every new object and writes the undo log. The
// original is unchanged when Prepare returns. A Txn with no changes is
// valid: applying it does nothing.
func Prepare(cfg layers.Config, opt Options) (*Txn, error) {
	if len(cfg.Lowers) > 1 {
		return nil, &Error{Stage: StagePrepare, Err: ErrSeveralLowers}
	}
	if err := fsutil.NeedProc(); err != nil {
		return nil, &Error{Stage: StagePrepare, Err: err}
	}
	lock, err := lockSandbox(cfg.Work)
	if err != nil {
		return nil, &Error{Stage: StagePrepare, Err: err}
	}
	x, err := prepare(cfg, opt, lock)
	if err != nil {
		unix.Close(lock)
		return nil, err
	}
	return x, nil
}

func prepare(cfg layers.Config, opt Options, lock int) (*Txn, error) {
	work := cfg.Work
	if _, err := os.Stat(filepath.Join(work, UndoLogName)); err == nil {
		return nil, &Error{Stage: StagePrepare, Err: ErrInterrupted}
	}
	cleanStale(cfg, "")
	if err := layers.CheckJournalIntact(journalPath(cfg)); err != nil {
		return nil, &Error{Stage: StagePrepare, Err: err}
	}
	cs, err := layers.Changes(cfg)
	if err != nil {
		return nil, &Error{Stage: StagePrepare, Err: err}
	}
	x := &Txn{cfg: cfg, work: work, opt: opt, changes: cs.Changes, lock: lock}
	x.log = undoLog{ID: newID(), State: statePrepared, Original: cfg.Lowers[0], Message: opt.Message}
	if len(cs.Changes) == 0 {
		return x, nil
	}
	if x.orig, err = openTree(cfg.Lowers[0]); err != nil {
		return nil, &Error{Stage: StagePrepare, Err: err}
	}
	x.orig.layout = cfg.LayoutXattr
	resolved, err := readRebase(work)
	if err != nil {
		x.closeTrees()
		return nil, &Error{Stage: StagePrepare, Err: err}
	}
	checked := cs
	cs = withMissingDirs(x.orig, cs, opt.Force, resolved)
	x.changes = cs.Changes
	steps := plan(cs)
	x.own = ownState{}
	if opt.Applied != nil {
		x.own = opt.Applied.own
	}
	x.fault("planned")
	// What the original holds where the apply will back up or set
	// metadata is recorded before the conflict check, not after: a write
	// made after the record is then a conflict of the check or, once the
	// check is over, of the apply (which compares with the record). The
	// other way round, a write between the two was neither, and the
	// backups took it away.
	var heldErr error
	if err := onOneMount(x.orig, steps); err != nil {
		heldErr = err
	} else {
		x.held, heldErr = heldObjects(x.orig, steps, newRenames(cs))
	}
	x.fault("held")
	if !opt.Force {
		if cf := conflicts(x.orig, cfg.Upper, checked, bases(cfg, checked.Bases()), checked.Bases()); len(cf) > 0 {
			x.closeTrees()
			return nil, &Error{Stage: StagePrepare, Conflicts: cf, Err: ErrConflict}
		}
	}
	x.fault("checked")
	if heldErr != nil {
		x.closeTrees()
		if ce := (*Error)(nil); errors.As(heldErr, &ce) {
			return nil, ce
		}
		return nil, &Error{Stage: StagePrepare, Err: heldErr}
	}
	if err := x.stage(cs, steps); err != nil {
		x.discardStage()
		x.closeTrees()
		if ce := (*Error)(nil); errors.As(err, &ce) {
			return nil, ce
		}
		return nil, &Error{Stage: StagePrepare, Err: err}
	}
	x.fault("staged")
	if err := writeUndoLog(work, &x.log); err != nil {
		x.discardStage()
		x.closeTrees()
		return nil, &Error{Stage: StagePrepare, Err: fmt.Errorf("write undo log: %w", err)}
	}
	x.fault("prepared")
	return x, nil
}

func journalPath(cfg layers.Config) string {
	if cfg.Journal != "" {
		return cfg.Journal
	}
	return filepath.Join(cfg.Work, "journal")
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Changes is what the transaction applies.
func (x *Txn) Changes() []layers.Change { return x.changes }

// ID names the transaction.
func (x *Txn) ID() string { return x.log.ID }

func (x *Txn) fault(point string) {
	if x.opt.Fault != nil {
		x.opt.Fault(point)
	}
}

func (x *Txn) close() {
	if x.lock >= 0 {
		unix.Close(x.lock)
		x.lock = -1
	}
	if x.orig != nil {
		x.orig.close()
	}
	if x.txn != nil {
		x.txn.close()
	}
}

// closeTrees closes the descriptors but keeps the lock (prepare's caller
// releases it on error).
func (x *Txn) closeTrees() {
	lock := x.lock
	x.lock = -1
	x.close()
	x.lock = lock
}

// txnDir picks the transaction directory: in the work directory when it
// is on the original's mount (then upper objects move by link and
// rename), else hidden in the original root. The same filesystem is not
// enough: through a bind mount, rename(2) fails with EXDEV.
func (x *Txn) txnDir() (string, bool, error) {
	sameFS, err := fsutil.SameMount(x.work, x.cfg.Lowers[0])
	if err != nil {
		return "", false, err
	}
	return txnDirFor(x.cfg, x.log.ID, sameFS), sameFS, nil
}

// txnDirFor is the transaction directory of commit id: in the private
// work directory when it shares the original's filesystem, else at the
// original's root.
func txnDirFor(cfg layers.Config, id string, inWork bool) string {
	if inWork {
		return filepath.Join(cfg.Work, "txn-"+id)
	}
	return filepath.Join(cfg.Lowers[0], ".sbxfs-txn-"+id)
}

// stage makes the transaction directory for the planned steps and puts
// every new object into it, durably.
func (x *Txn) stage(cs layers.ChangeSet, steps []step) error {
	dir, sameFS, err := x.txnDir()
	if err != nil {
		return err
	}
	if !sameFS {
		// Named before it exists, so a crash before the undo log leaves
		// a name to clean up: only what this sandbox made is removed.
		if err := fsutil.WriteFileAtomic(filepath.Join(x.work, pendingTxnName), []byte(dir), 0o600); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if !sameFS {
			_ = os.Remove(filepath.Join(x.work, pendingTxnName)) // nothing was made
		}
		return err
	}
	if x.txn, err = openTxnDir(dir); err != nil {
		return err // not ours: left alone (x.log.Txn unset)
	}
	x.txn.layout = x.orig.layout
	x.log.Txn = dir
	for _, sub := range []string{"b", "s", "m"} {
		if err := x.txn.mkdir(sub, 0o700); err != nil {
			return err
		}
	}
	x.fault("staging")
	r := newRenames(cs)
	x.log.Steps = steps
	staged := map[[2]uint64]*step{} // upper inode -> its first install
	made := map[string]bool{}       // final paths that get a new object
	for _, s := range steps {
		if s.Kind == opInstall || s.Kind == opMkdir {
			made[s.Path] = true
		}
	}
	for i := range x.log.Steps {
		if err := x.fill(&x.log.Steps[i], r, sameFS, staged, made); errors.Is(err, unix.ELOOP) {
			// A symlink on the way to what the check just saw: the
			// original changing under the commit.
			return conflictAt(StagePrepare, x.log.Steps[i].Path, ReasonChangedWhileRead)
		} else if err != nil {
			return err
		}
	}
	return x.txn.syncfs()
}

// onOneMount refuses steps that would move an object into or out of a
// filesystem mounted inside the original: the transaction directory is on
// the original's own mount and rename(2) does not cross mounts, so the
// apply would fail with EXDEV (and be undone). Metadata steps work on any
// mount.
func onOneMount(orig *tree, steps []step) error {
	root, err := orig.mountOf("")
	if err != nil {
		return &Error{Stage: StagePrepare, Err: err}
	}
	if root == 0 {
		return nil // no mount ids here: the apply would say EXDEV
	}
	seen := map[string]uint64{}
	for _, s := range steps {
		if s.Kind == opMeta || s.In != "" {
			continue // a staged directory above takes it along
		}
		var id uint64
		if s.Kind == opDetach {
			// A directory that is a mount point cannot move either.
			if id, err = orig.dirMount(s.Path); err != nil && !noDir(err) {
				return &Error{Stage: StagePrepare, Paths: []string{s.Path}, Err: err}
			}
		}
		if id == 0 {
			dir := parentRel(s.Path)
			var ok bool
			if id, ok = seen[dir]; !ok {
				if id, err = orig.mountOf(dir); err != nil {
					return &Error{Stage: StagePrepare, Paths: []string{s.Path}, Err: err}
				}
				seen[dir] = id
			}
		}
		if id != root {
			return &Error{Stage: StagePrepare, Paths: []string{s.Path}, Err: fmt.Errorf("%w: %s", ErrOtherMount, s.Path)}
		}
	}
	return nil
}

// fill completes a planned step from the upper and the original: the
// staged object of an install, the metadata of a meta step, the inode an
// attach moves.
// Names of one upper inode (hard links) are staged as one inode: linked
// from the upper, or copied once and linked within the transaction.
func (x *Txn) fill(s *step, r renames, sameFS bool, staged map[[2]uint64]*step, made map[string]bool) error {
	var upper string // the sandbox's object, however deep (fsutil.ShortPath)
	if s.Kind == opInstall || s.Kind == opMkdir || s.Kind == opMeta {
		up, err := fsutil.ShortPath(x.cfg.Upper, s.Path)
		if err != nil {
			return fmt.Errorf("stage %s: %w", filepath.Join(x.cfg.Upper, s.Path), err)
		}
		defer up.Close()
		upper = up.Path
	}
	switch s.Kind {
	case opInstall:
		var st unix.Stat_t
		if err := unix.Lstat(upper, &st); err != nil {
			return fmt.Errorf("stage %s: %w", upper, err)
		}
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := staged[key]; ok && !sameFS {
			if err := unix.Linkat(x.txn.fd, first.staged(), x.txn.fd, s.staged(), 0); err != nil {
				return fmt.Errorf("stage %s: %w", upper, err)
			}
			s.Ino, s.Strip, s.Staged = first.Ino, first.Strip, first.Staged
			return nil
		}
		ss, strip, err := stageObject(upper, &st, x.txn, s.staged(), sameFS)
		s.Ino, s.Strip = ss.Ino, strip
		if st.Nlink > 1 {
			staged[key] = s
		}
		if err != nil {
			return err
		}
		if ss.Mode&unix.S_IFMT == unix.S_IFREG {
			s.Staged = &stagedFile{Size: ss.Size, Mtime: unix.TimespecToNsec(ss.Mtim)}
		}
		return nil
	case opMkdir:
		// The new directory is made in the transaction directory and
		// moved in like a staged file, so its inode is in the undo log and
		// an undo never removes a directory it did not make.
		var st unix.Stat_t
		if err := unix.Lstat(upper, &st); err != nil {
			return err
		}
		s.Mode = st.Mode & 0o7777
		if err := x.txn.mkdir(s.staged(), 0o700); err != nil {
			return fmt.Errorf("stage directory %s: %w", s.Path, err)
		}
		ds, err := x.txn.lstat(s.staged())
		if err != nil {
			return err
		}
		s.Ino = ds.Ino
	case opDetach:
		if strings.HasPrefix(s.Slot, "m/") {
			// A directory moved aside to come back renamed: the apply
			// moves that directory, not whatever is at its path then.
			st, err := x.orig.lstat(s.Path)
			if err != nil {
				return fmt.Errorf("renamed directory %s: %w", s.Path, err)
			}
			s.Ino = st.Ino
		}
	case opAttach:
		st, err := x.orig.lstat(r.original(s.Path))
		if err != nil {
			return fmt.Errorf("renamed directory %s: %w", s.Path, err)
		}
		s.Ino = st.Ino
	case opMeta:
		fd, err := unix.Open(upper, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0) // the upper's own object
		if err != nil {
			return err
		}
		s.New, err = metaOf(fd, x.orig.isLayout)
		unix.Close(fd)
		if err != nil {
			return err
		}
		if fsutil.HeldFlags(x.cfg.Work) != fsutil.CarriedFlags {
			// The copy may have lost flags its filesystem cannot
			// keep, and the sandbox could change none
			// (layers.SetFlags): the original keeps its own.
			s.New.Flags = nil
		}
		// What the undo sets back: nothing for a new object (the undo
		// takes it away), nor where the original has nothing. A path
		// that cannot be read (a symlink swapped in on the way) fails
		// the commit now: applied without its old metadata, the step
		// could not be undone.
		if made[s.Path] {
			return nil
		}
		o := r.original(s.Path)
		there, st, err := x.orig.exists(o)
		if err == nil && !there {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the original's metadata of %s: %w", o, err)
		}
		if s.Old, err = x.orig.metaAt(o); err != nil {
			return fmt.Errorf("read the original's metadata of %s: %w", o, err)
		}
		s.Ino = st.Ino
	}
	return nil
}

// openTxnDir opens a transaction directory, refusing one that is not a
// directory only this process's user may enter: in the original's root
// another process may rename the one the commit made away and put its
// own or a symlink there. Everything the commit stages, moves and removes
// in it goes through the descriptor (tree), so what was made goes on
// landing in the private directory wherever it is moved, never through a
// symlink.
func openTxnDir(dir string) (*tree, error) {
	t, err := openTree(dir)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(t.fd, &st); err != nil {
		t.close()
		return nil, err
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		t.close()
		return nil, fmt.Errorf("transaction directory %s is not the private one the commit made (owner %d, mode %#o): another process put it there; "+
			"remove it if it is not yours and commit again", dir, st.Uid, st.Mode&0o7777)
	}
	return t, nil
}

// discardStage removes the transaction directory of a commit that never
// reached the original (nothing in it is the original's).
func (x *Txn) discardStage() {
	if x.log.Txn != "" {
		restoreStripped(x.txn, x.log.Steps)
		_ = x.removeStage()
	}
}

// removeStage removes what the transaction directory holds, through its
// descriptor (wherever another process may have moved it), then its
// name, if that still names a private directory of this user's.
func (x *Txn) removeStage() error {
	if x.txn == nil {
		return nil
	}
	if err := fsutil.RemoveContentsAt(x.txn.fd); err != nil {
		return err
	}
	removeTxnDir(x.log.Txn)
	return nil
}

// removeTxnDir removes the transaction directory dir with what it holds,
// unless what is there now is not a private directory of this user's
// (another process's, put in its place in the original's root).
func removeTxnDir(dir string) {
	if t, err := openTxnDir(dir); err == nil {
		t.close()
		_ = os.RemoveAll(dir)
	}
}

// cleanStale removes transaction directories no undo log names: what a
// crash left between staging and writing the undo log (links to upper
// objects and copies only; nothing of the original's).
//
// In the sandbox's private work directory every txn-* is ours. In the
// original only the one directory this sandbox named in work/txn.pending
// is: a user's own .sbxfs-txn-* entries are never touched.
func cleanStale(cfg layers.Config, keep string) {
	dirs, _ := filepath.Glob(filepath.Join(cfg.Work, "txn-*"))
	pending := filepath.Join(cfg.Work, pendingTxnName)
	if b, err := os.ReadFile(pending); err == nil {
		d := string(b)
		if filepath.Dir(d) == filepath.Clean(cfg.Lowers[0]) && strings.HasPrefix(filepath.Base(d), ".sbxfs-txn-") {
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs {
		if d == keep {
			continue
		}
		removeTxnDir(d)
	}
	if keep == "" {
		_ = os.Remove(pending)
	}
}

// pendingTxnName (in the work directory) names the transaction directory
// a commit is about to make in the original.
const pendingTxnName = "txn.pending"
