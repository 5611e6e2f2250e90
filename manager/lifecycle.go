package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// RollbackPlan discards the changes of every active sandbox of plan; the
// originals are untouched. Without keep the sandboxes are unmounted and
// their directories removed (rolled back); with keep they stay, empty and
// active, for re-use. Nested sandboxes go before their parents (the one
// mounted on top first). It goes on past a failure and reports each.
func (m *Manager) RollbackPlan(ctx context.Context, plan string, keep bool) (*BatchResult, error) {
	return m.rollback(ctx, plan, "", keep)
}

// Rollback rolls back the one sandbox id (see RollbackPlan).
func (m *Manager) Rollback(ctx context.Context, id string, keep bool) (*BatchResult, error) {
	r, ok := m.get(id)
	if !ok {
		return (&BatchResult{Op: "rollback " + id, Err: fmt.Errorf("%w: %s", ErrNotFound, id)}).finish()
	}
	return m.rollback(ctx, r.Plan, id, keep)
}

func (m *Manager) rollback(ctx context.Context, plan, only string, keep bool) (*BatchResult, error) {
	res := &BatchResult{Op: "rollback plan " + plan}
	if only != "" {
		res.Op = "rollback " + only
	}
	done, err := m.enterPlan(ctx, plan)
	if err != nil {
		res.Err = err
		return res.finish()
	}
	defer done()
	if err := m.settlePlan(plan); err != nil {
		m.log.Warn("an earlier commit of the plan is unsettled; its sandboxes are not rolled back", "plan", plan, "err", err)
	}
	rs := m.snapshot(plan)
	if len(rs) == 0 && only == "" {
		res.Err = noPlan(plan)
		return res.finish()
	}
	for _, r := range m.childrenFirst(rs) {
		switch {
		case only != "" && r.ID != only:
		case r.State == Active:
			if err := m.rollbackOne(&r, keep); err != nil {
				res.fail(r.ID, err)
			} else {
				res.Done = append(res.Done, r.ID)
			}
		case only != "":
			res.fail(r.ID, fmt.Errorf("%w: it is %s", ErrNotActive, r.State))
		}
	}
	return res.finish()
}

func (m *Manager) rollbackOne(r *record, keep bool) error {
	if hasUndoLog(m.work(r.ID)) {
		return fmt.Errorf("%w: its changes are kept until it is recovered", ErrInterrupted)
	}
	if !keep {
		if err := m.nestedActive(r); err != nil {
			return err
		}
	}
	if keep {
		if err := m.reset(&participant{rec: *r, closeCtl: func() {}}); err != nil {
			return err
		}
		if err := r.move(RolledBack); err != nil {
			return err
		}
		r.Error = ""
		return m.moveSave(r, Active)
	}
	if err := m.unmountSandbox(r, false); err != nil {
		return err
	}
	if err := m.purgeDirs(r); err != nil {
		return err
	}
	r.Error = ""
	return m.moveSave(r, RolledBack)
}

// Destroy unmounts sandbox id (lazily when busy), removes every directory
// it made and leaves its record, cleaned up. Destroying a cleaned-up
// sandbox does nothing. A sandbox holding an interrupted commit that
// cannot be recovered is refused: its undo log and backups are kept.
func (m *Manager) Destroy(ctx context.Context, id string) error {
	leave, err := m.enter()
	if err != nil {
		return err
	}
	defer leave()
	return m.destroyID(ctx, id)
}

func (m *Manager) destroyID(ctx context.Context, id string) error {
	r, ok := m.get(id)
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	unlock, err := m.lockPlan(ctx, r.Plan)
	if err != nil {
		return err
	}
	defer unlock()
	if r, ok = m.get(id); !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return m.destroy(&r)
}

// destroy purges r under its plan's lock.
func (m *Manager) destroy(r *record) error {
	if r.State == CleanedUp {
		return nil
	}
	if err := m.nestedActive(r); err != nil {
		return err
	}
	if hasUndoLog(m.work(r.ID)) {
		if err := m.settlePlan(r.Plan); err != nil {
			return err
		}
	}
	if err := m.unmountSandbox(r, true); err != nil {
		return err
	}
	if err := m.purgeDirs(r); err != nil {
		return err
	}
	r.Error = ""
	if err := m.moveSave(r, CleanedUp); err != nil {
		return err
	}
	m.log.Info("sandbox destroyed", "sandbox", r.ID)
	return nil
}

// DestroyPlan destroys every sandbox of plan, nested sandboxes before
// their parents, going on past failures.
func (m *Manager) DestroyPlan(ctx context.Context, plan string) (*BatchResult, error) {
	res := &BatchResult{Op: "destroy plan " + plan}
	done, err := m.enterPlan(ctx, plan)
	if err != nil {
		res.Err = err
		return res.finish()
	}
	defer done()
	rs := m.snapshot(plan)
	if len(rs) == 0 {
		res.Err = noPlan(plan)
		return res.finish()
	}
	for _, r := range m.childrenFirst(rs) {
		if r.State == CleanedUp {
			continue
		}
		if err := m.destroy(&r); err != nil {
			res.fail(r.ID, err)
		} else {
			res.Done = append(res.Done, r.ID)
		}
	}
	return res.finish()
}

// noPlan is the error of a plan-wide commit, rollback or destroy of a
// plan no sandbox was ever made in (or whose sandboxes were all
// destroyed): a misspelt name, which succeeding with nothing done would
// hide.
func noPlan(plan string) error {
	return fmt.Errorf("%w in plan %s", ErrNotFound, plan)
}

// purgeDirs removes r's upper and work directories and the mountpoint the
// manager made (rmdir only: never through a mount). A work directory
// holding an undo log is refused: it may hold the only backups of an
// original.
func (m *Manager) purgeDirs(r *record) error {
	if hasUndoLog(m.work(r.ID)) {
		return fmt.Errorf("%w: %s is kept", ErrInterrupted, m.work(r.ID))
	}
	var errs []error
	for _, d := range []string{m.upper(r.ID), m.work(r.ID)} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	if r.OwnMount {
		if err := os.Remove(r.Mountpoint); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// Empty here; a view still mounted in this namespace stays (gc).
	os.Remove(filepath.Join(m.dir(r.ID), InPlaceView))
	return errors.Join(errs...)
}

// enterPlan enters the manager and takes the plan's lock (in that order,
// see the lock order in manager.go); done releases both.
func (m *Manager) enterPlan(ctx context.Context, plan string) (done func(), err error) {
	leave, err := m.enter()
	if err != nil {
		return nil, err
	}
	unlock, err := m.lockPlan(ctx, plan)
	if err != nil {
		leave()
		return nil, err
	}
	return func() { unlock(); leave() }, nil
}

// childrenFirst orders rs (List order) so that a sandbox nested in another
// comes before it, as in a commit: whatever is mounted on top of a mount
// goes first. Without nesting the order is unchanged.
func (m *Manager) childrenFirst(rs []record) []record {
	var live, rest []record
	for _, r := range rs {
		if r.State == Active || r.State == Pending {
			live = append(live, r)
		} else {
			rest = append(rest, r)
		}
	}
	order, err := commitOrder(live)
	if err != nil {
		m.log.Warn("cannot order nested sandboxes", "err", err)
		return rs
	}
	return append(order, rest...)
}

// Unmount takes sandbox id's mount down and waits for its server to
// finish (the journal flushed). The sandbox stays active with its changes
// (Get says Mounted false): it can still be committed, rolled back or
// destroyed; Mount mounts it again, and so does the next manager with
// Options.Mount (the next daemon). A busy mount fails (unix.EBUSY) unless
// lazy, which detaches it at once and does not wait for the files open
// under it. A sandbox with a mounted sandbox nested in it is refused
// (ErrNested): unmount that one first. Unmounting a sandbox that is not
// mounted does nothing.
func (m *Manager) Unmount(ctx context.Context, id string, lazy bool) error {
	r, ok := m.get(id)
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	done, err := m.enterPlan(ctx, r.Plan)
	if err != nil {
		return err
	}
	defer done()
	if r, ok = m.get(id); !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if r.State != Active {
		return fmt.Errorf("%w: sandbox %s is %s", ErrNotActive, id, r.State)
	}
	for _, o := range m.snapshot("") {
		if o.State == Active && nestedIn(&o, &r) && m.mountOf(o.ID) != nil {
			return fmt.Errorf("%w: sandbox %s is mounted on it (its original is %s): unmount it first", ErrNested, o.ID, o.Original)
		}
	}
	mt := m.mountOf(id)
	if mt == nil {
		return m.unmountSandbox(&r, lazy) // a stale mount, or one served elsewhere
	}
	// A file closed just before may hold the mount a moment longer (the
	// kernel releases FUSE files asynchronously): retry briefly.
	for delay := 20 * time.Millisecond; ; delay *= 2 {
		err = unmountServed(mt, r.Mountpoint)
		if err == nil || !errors.Is(err, unix.EBUSY) || delay > time.Second {
			break
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil && lazy && errors.Is(err, unix.EBUSY) {
		m.log.Info("the mount is busy; detaching it lazily", "sandbox", id)
		return lazyDetach(r.Mountpoint)
	}
	if err != nil {
		return err
	}
	select {
	case <-mt.done:
	case <-time.After(unmountWait):
		return fmt.Errorf("%s is unmounted but its server has not finished after %s", r.Mountpoint, unmountWait)
	}
	m.log.Info("sandbox unmounted; it stays active", "sandbox", id)
	return nil
}

// Mount mounts the active sandbox id again at its recorded mountpoint,
// served in this process (Options.Mount; a manager without it refuses,
// ErrInvalid), and returns it (Mounted true): the undo of Unmount, without
// waiting for the next manager. The state does not change (it stays
// active); the registry records the mount.
//
// Refused: an unknown id (ErrNotFound); a sandbox that is not active
// (ErrNotActive); one mounted already, here or by another process
// (ErrMounted); a nested sandbox whose parent is not mounted
// (ErrParentUnmounted: mount the parent first, parents before children
// as New does); something else mounted at its mountpoint (unix.EBUSY); a
// mountpoint that is not an empty directory (ErrInvalid; the manager's own
// mountpoint under StateRoot/mnt is made again when it went away). A
// sandbox holding an interrupted commit has its plan settled first, as a
// commit would.
func (m *Manager) Mount(ctx context.Context, id string) (Sandbox, error) {
	r, ok := m.get(id)
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	done, err := m.enterPlan(ctx, r.Plan)
	if err != nil {
		return Sandbox{}, err
	}
	defer done()
	check := func() error {
		var ok bool
		if r, ok = m.get(id); !ok {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		if r.State != Active {
			return fmt.Errorf("%w: sandbox %s is %s", ErrNotActive, id, r.State)
		}
		return nil
	}
	if err := check(); err != nil {
		return Sandbox{}, err
	}
	if !m.opt.Mount {
		return Sandbox{}, fmt.Errorf("%w: this manager keeps its sandboxes unmounted (Options.Mount is false)", ErrInvalid)
	}
	if m.mountOf(id) != nil {
		if !m.inMountTable(&r) {
			// Unmounted lazily: its server lives on for the files still open
			// under the detached mount. A second server must not share the
			// upper.
			return Sandbox{}, fmt.Errorf("%w: sandbox %s was detached lazily and still serves the files open under it; close them, then mount it again", ErrMounted, id)
		}
		return Sandbox{}, fmt.Errorf("%w: sandbox %s at %s; nothing to do", ErrMounted, id, r.Mountpoint)
	}
	for _, o := range m.snapshot("") {
		if o.State == Active && nestedIn(&r, &o) && m.mountOf(o.ID) == nil {
			return Sandbox{}, fmt.Errorf("%w: sandbox %s is nested in sandbox %s (its original %s is that sandbox's mount); mount sandbox %s first",
				ErrParentUnmounted, id, o.ID, r.Original, o.ID)
		}
	}
	if hasUndoLog(m.work(id)) {
		if err := m.settlePlan(r.Plan); err != nil {
			return Sandbox{}, fmt.Errorf("sandbox %s holds an interrupted commit that could not be settled: %w", id, err)
		}
		if err := check(); err != nil {
			return Sandbox{}, err
		}
	}
	if err := m.clearMounts(&r); err != nil {
		return Sandbox{}, err
	}
	if r.OwnMount {
		if err := mkdirPrivate(r.Mountpoint); err != nil && !errors.Is(err, os.ErrExist) {
			return Sandbox{}, fmt.Errorf("sandbox %s: make its mountpoint again: %w", id, err)
		}
	}
	if err := checkMountpoint(r.Mountpoint); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := m.mountSandbox(&r); err != nil {
		return Sandbox{}, fmt.Errorf("mount sandbox %s at %s: %w", id, r.Mountpoint, err)
	}
	m.log.Info("sandbox mounted again", "sandbox", id, "mountpoint", r.Mountpoint)
	return m.view(&r), nil
}

// inMountTable reports whether r's mount is at its mountpoint (true when
// the mount table cannot be read).
func (m *Manager) inMountTable(r *record) bool {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return true
	}
	for _, e := range mounts {
		if e.Mountpoint == r.Mountpoint && e.Source == m.work(r.ID) && ownSbxfs(&e) {
			return true
		}
	}
	return false
}

// clearMounts detaches the stale mounts of r (a server that died leaves
// its mount behind) and refuses (ErrMounted) when a live process serves
// r anywhere: two servers must never share an upper. Something else
// mounted at r's mountpoint is refused too (unix.EBUSY: busy, as a
// mountpoint already mounted is for every mount).
func (m *Manager) clearMounts(r *record) error {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return err
	}
	for _, e := range mounts {
		if e.Source != m.work(r.ID) || !ownSbxfs(&e) {
			if e.Mountpoint == r.Mountpoint {
				return fmt.Errorf("sandbox %s: its mountpoint %s is already a mount point (%s from %s); unmount that first: %w", r.ID, r.Mountpoint, e.FSType, e.Source, unix.EBUSY)
			}
			continue
		}
		if !fsutil.IsStaleMount(e.Mountpoint) {
			return fmt.Errorf("%w: sandbox %s is mounted at %s by another process; unmount it there first", ErrMounted, r.ID, e.Mountpoint)
		}
		if err := lazyDetach(e.Mountpoint); err != nil {
			return fmt.Errorf("sandbox %s: detach its stale mount: %w", r.ID, err)
		}
		m.log.Info("detached a stale mount of the sandbox", "sandbox", r.ID, "mountpoint", e.Mountpoint)
	}
	return nil
}

// unmountServed unmounts a mount this process serves; its server then
// finishes (mount.done), a copy of the mount elsewhere cut off. A busy
// mount fails with unix.EBUSY.
func unmountServed(mt *mount, mnt string) error {
	if os.Geteuid() == 0 {
		if err := mt.srv.InUseElsewhere(); err != nil {
			return err
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			return fmt.Errorf("unmount %s: %w", mnt, err)
		}
		mt.srv.CutOff()
		return nil
	}
	return mt.srv.Unmount() // fusermount3 -u; unix.EBUSY when busy
}

// Moved records newOriginal as the new place of sandbox id's original,
// which was moved there (mv), then mounts the sandbox there when the
// manager mounts (as Mount). The changes keep their bases, which name
// objects by inode: after a move they match, after a copy every path
// the sandbox changed conflicts, as for any other writer. Refused: a
// sandbox that is not active (ErrNotActive) or is mounted (ErrMounted:
// its original was not moved, or unmount it first); a recorded original
// that is still a directory (ErrInvalid: that is another original); a
// new place that is not a directory, or that collides with the state
// root or another sandbox as Create would refuse it (ErrInvalid).
func (m *Manager) Moved(ctx context.Context, id, newOriginal string) (Sandbox, error) {
	r, ok := m.get(id)
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	orig, err := resolveDir("new place of the original", newOriginal)
	if err != nil {
		return Sandbox{}, err
	}
	done, err := m.enterPlan(ctx, r.Plan)
	if err != nil {
		return Sandbox{}, err
	}
	err = m.moved(id, orig)
	done()
	if err != nil {
		return Sandbox{}, err
	}
	m.log.Info("sandbox's original moved", "sandbox", id, "original", orig)
	if !m.opt.Mount {
		r, _ = m.get(id)
		return m.view(&r), nil
	}
	return m.Mount(ctx, id)
}

// moved is Moved's change of the records, with the plan locked.
func (m *Manager) moved(id, orig string) error {
	r, ok := m.get(id)
	switch {
	case !ok:
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	case r.State != Active:
		return fmt.Errorf("%w: sandbox %s is %s", ErrNotActive, id, r.State)
	case m.mountOf(id) != nil:
		return fmt.Errorf("%w: sandbox %s is mounted over %s, which was not moved; unmount it first", ErrMounted, id, r.Original)
	case r.Original == orig:
		return nil
	}
	if fi, err := os.Stat(r.Original); err == nil && fi.IsDir() {
		return fmt.Errorf("%w: the recorded original %s is still there; %s would be another original, not a moved one", ErrInvalid, r.Original, orig)
	}
	moved := r
	moved.Original = orig
	unlock := m.lockRegistry()
	err := m.checkPlacement(&moved)
	unlock()
	if err != nil {
		return err
	}
	cfg, err := m.layersConfig(id)
	if err != nil {
		return err
	}
	cfg.Lowers = []string{orig}
	if err := layers.Rebind(&cfg); errors.Is(err, layers.ErrStillThere) {
		return fmt.Errorf("%w: sandbox %s: %v", ErrInvalid, id, err)
	} else if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	moved.Updated = time.Now().UTC()
	return m.save(&moved)
}
