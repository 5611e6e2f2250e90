package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/sbxfs/sbxfs/fsutil"
)

// GC purges what was abandoned, goes on past failures and reports each
// (by sandbox id, or directory name for a directory without a record):
//
//   - directories under StateRoot/sandboxes without a record (a damaged
//     record is reported, never purged: it may describe live changes);
//   - records whose directories are gone (errored) or left over after a
//     commit or rollback; creations that never finished;
//   - stale mounts: sbxfs mounts of this state root whose server is gone,
//     and mountpoint directories under StateRoot/mnt nobody uses.
//
// A directory holding an undo log is never removed: it may hold the only
// backups of an original.
func (m *Manager) GC(ctx context.Context) (*BatchResult, error) {
	res := &BatchResult{Op: "gc"}
	leave, err := m.enter()
	if err != nil {
		res.Err = err
		return res.finish()
	}
	defer leave()
	m.gcOrphans(res)
	m.gcRecords(ctx, res)
	m.gcMounts(res)
	return res.finish()
}

// gcOrphans removes sandbox directories the registry does not know.
func (m *Manager) gcOrphans(res *BatchResult) {
	s, err := scanSandboxes(filepath.Join(m.root, "sandboxes"))
	if err != nil {
		res.fail("sandboxes", err)
		return
	}
	names := make([]string, 0, len(s.damaged))
	for name := range s.damaged {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		res.fail(name, fmt.Errorf("%w; left in place, repair or remove it by hand", s.damaged[name]))
	}
	for _, name := range s.orphans {
		if _, known := m.get(name); known {
			continue // being created (the registry knows it before its directory exists)
		}
		dir := filepath.Join(m.root, "sandboxes", name)
		if hasUndoLog(filepath.Join(dir, "work")) {
			res.fail(name, fmt.Errorf("%w: directory without a record kept", ErrInterrupted))
			continue
		}
		err := m.detachSource(filepath.Join(dir, "work"))
		if err == nil {
			err = os.RemoveAll(dir)
		}
		if err != nil {
			res.fail(name, err)
			continue
		}
		m.log.Info("gc: removed a sandbox directory without a record", "dir", dir)
		res.Done = append(res.Done, name)
	}
}

// abandoned reports whether GC should purge r: errored, a creation that
// never finished, an active sandbox that lost its directories, or a
// finished one whose directories are still there.
func (m *Manager) abandoned(r *record) bool {
	switch r.State {
	case Errored, Pending:
		return true
	case Active:
		return !m.dirsPresent(r.ID)
	}
	for _, d := range []string{m.upper(r.ID), m.work(r.ID)} {
		if _, err := os.Lstat(d); err == nil {
			return true
		}
	}
	return false
}

// gcRecords purges abandoned records, each under its plan's lock.
func (m *Manager) gcRecords(ctx context.Context, res *BatchResult) {
	for _, snap := range m.snapshot("") {
		if !m.abandoned(&snap) {
			continue
		}
		unlock, err := m.lockPlan(ctx, snap.Plan)
		if err != nil {
			res.fail(snap.ID, err)
			continue
		}
		r, ok := m.get(snap.ID)
		if ok && m.abandoned(&r) {
			if err := m.purgeRecord(&r); err != nil {
				res.fail(r.ID, err)
			} else {
				res.Done = append(res.Done, r.ID)
			}
		}
		unlock()
	}
}

func (m *Manager) purgeRecord(r *record) error {
	if r.State == Active {
		r.Error = "its upper or work directory is missing"
		if err := m.moveSave(r, Errored); err != nil {
			return err
		}
	}
	if err := m.unmountSandbox(r, true); err != nil {
		return err
	}
	if err := m.purgeDirs(r); err != nil {
		return err
	}
	m.log.Info("gc: purged an abandoned sandbox", "sandbox", r.ID, "state", r.State)
	if r.State == CleanedUp || r.State == Committed || r.State == RolledBack {
		return nil
	}
	r.Error = ""
	return m.moveSave(r, CleanedUp)
}

// gcMounts detaches sbxfs mounts of this state root that nobody serves
// and removes unused mountpoint directories under StateRoot/mnt.
func (m *Manager) gcMounts(res *BatchResult) {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		res.fail("mounts", err)
		return
	}
	sbx := filepath.Join(m.root, "sandboxes")
	for _, e := range mounts {
		id := filepath.Base(filepath.Dir(e.Source))
		if !ownSbxfs(&e) || !within(e.Source, sbx) || m.mountOf(id) != nil || !fsutil.IsStaleMount(e.Mountpoint) {
			continue
		}
		if err := lazyDetach(e.Mountpoint); err != nil {
			res.fail(id, err)
			continue
		}
		m.log.Info("gc: detached a stale mount", "mountpoint", e.Mountpoint, "source", e.Source)
		res.Done = append(res.Done, id)
	}
	ents, _ := os.ReadDir(filepath.Join(m.root, "mnt"))
	for _, e := range ents {
		r, ok := m.get(e.Name())
		if ok && (r.State == Active || r.State == Pending) {
			continue
		}
		// rmdir: a directory that is still a mount or holds entries stays.
		if err := os.Remove(filepath.Join(m.root, "mnt", e.Name())); err == nil {
			m.log.Info("gc: removed an unused mountpoint", "dir", e.Name())
			res.Done = append(res.Done, e.Name())
		} else if !errors.Is(err, os.ErrNotExist) {
			res.fail(e.Name(), err)
		}
	}
}

// detachSource detaches every mount whose source is the work directory
// work (a sandbox directory is never removed under a live mount).
func (m *Manager) detachSource(work string) error {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return err
	}
	for _, e := range mounts {
		if e.Source == work && ownSbxfs(&e) {
			if err := lazyDetach(e.Mountpoint); err != nil {
				return err
			}
		}
	}
	return nil
}
