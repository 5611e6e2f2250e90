package manager

// Lock order. A goroutine takes the manager's locks in this order only,
// never two of the same level, and releases them in reverse:
//
//  1. life (Manager.life, RWMutex): every public call shares it; Close
//     takes it alone, so Close waits for the calls in flight.
//  2. plan (one per plan name: an in-process semaphore, then a flock on
//     StateRoot/plans/<plan>.lock for other processes): held for the WHOLE
//     commit, rollback, destroy or create in that plan, so nothing can add,
//     remove or commit a sandbox of the plan in the middle (PITFALLS 8).
//     Operations on several plans (GC, Close) take them one at a time.
//  3. the sandbox's commit lock (a flock on work/commit.lock), taken inside
//     commit.Prepare and commit.Recover.
//  4. registry (Manager.mu): the in-memory records and mounts. Held only to
//     read or replace entries: no I/O and no other lock under it.
//
// planLocks.mu and the order checker's own mutex guard their maps only and
// are outside the order. Records are written to disk under the plan lock,
// outside the registry lock: every change of a sandbox happens under its
// plan's lock, so two writers of one record never race. With
// checkLockOrder on (the tests switch it on) a violation of levels 1, 2
// and 4 panics at once.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// Options of a Manager.
type Options struct {
	StateRoot string // required; created with mode 0700
	Logger    *slog.Logger
	// Mount serves every active sandbox as a FUSE mount in this process.
	// When false, sandboxes exist on disk only (upper and work) and are
	// changed through layers.Open(m.Config(id)): a process must not serve a
	// mount it also writes into.
	Mount bool
	// NoIOUring has the mounts take the kernel's requests from /dev/fuse
	// even where the kernel offers FUSE over io_uring (fuse.Config).
	NoIOUring bool
	// DestroyOnExit makes Close (and SIGINT or SIGTERM once WatchSignals
	// is used) destroy every sandbox this manager created.
	DestroyOnExit bool
	// Fault, when set, is called at the named points of every plan commit,
	// before CommitOptions.Fault (tests kill the process there: the
	// daemon's SBXFS_FAULT).
	Fault func(point string)
}

// Manager owns the sandboxes of one state root. One manager per state
// root, across processes.
type Manager struct {
	root string
	opt  Options
	log  *slog.Logger
	lock *os.File // StateRoot/manager.lock, flocked

	life   sync.RWMutex
	closed bool // guarded by life

	plans planLocks

	mu      sync.Mutex             // the registry lock
	recs    map[string]*record     // every record, by id
	damaged map[string]error       // sandbox directories whose record is refused
	mounts  map[string]*mount      // sandboxes served in this process
	stuck   map[string]*commit.Txn // transactions whose undo failed, to retry
	created map[string]bool        // sandboxes this manager created

	closeOnce sync.Once
	closeErr  error
}

// New opens the state root: it takes its lock (ErrLocked when another
// manager holds it), loads and reconciles the registry, recovers
// interrupted commits and, with Options.Mount, mounts every active
// sandbox.
func New(opt Options) (*Manager, error) {
	root, err := openStateRoot(opt.StateRoot)
	if err != nil {
		return nil, err
	}
	lock, err := lockStateRoot(root)
	if err != nil {
		return nil, err
	}
	m := &Manager{root: root, opt: opt, log: opt.Logger, lock: lock,
		recs: map[string]*record{}, damaged: map[string]error{}, mounts: map[string]*mount{},
		stuck: map[string]*commit.Txn{}, created: map[string]bool{}}
	if m.log == nil {
		m.log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if err := m.load(); err != nil {
		lock.Close()
		return nil, err
	}
	m.recoverAll()
	if opt.Mount {
		// The kernel sends the modes it wants applied; do not mask them.
		unix.Umask(0)
		m.mountAll()
	}
	return m, nil
}

// openStateRoot creates the state root and its directories (0700) and
// returns its resolved path.
func openStateRoot(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w: no state root given", ErrInvalid)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("%w: state root: %v", ErrInvalid, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", fmt.Errorf("state root: %w", err)
	}
	if err := os.Chmod(abs, 0o700); err != nil {
		return "", fmt.Errorf("state root: %w", err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return "", fmt.Errorf("state root: %w", err)
	}
	for _, sub := range []string{"sandboxes", "plans", "mnt"} {
		if err := os.Mkdir(filepath.Join(abs, sub), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("state root: %w", err)
		}
	}
	return abs, nil
}

// load reads every record and reconciles it with the disk: a creation
// that never finished is purged; an active sandbox whose directories are
// gone is errored (GC purges it). A damaged record is reported and
// skipped; directories without records are left to GC.
func (m *Manager) load() error {
	s, err := scanSandboxes(filepath.Join(m.root, "sandboxes"))
	if err != nil {
		return fmt.Errorf("read the registry: %w", err)
	}
	for name, err := range s.damaged {
		m.log.Error("skipping a damaged sandbox record; GC reports it, nothing is removed", "dir", name, "err", err)
	}
	m.damaged = s.damaged
	for _, r := range s.records {
		m.recs[r.ID] = r
	}
	for _, r := range sortRecords(s.records) {
		m.reconcile(r)
	}
	if len(s.orphans) > 0 {
		m.log.Warn("sandbox directories without a record; GC removes them", "dirs", s.orphans)
	}
	return nil
}

func (m *Manager) reconcile(r *record) {
	switch {
	case r.State == Pending:
		m.log.Warn("purging a sandbox whose creation was interrupted", "sandbox", r.ID)
		err := m.purgeDirs(r)
		m.settle(r, err, CleanedUp, "creation interrupted; purge failed: ")
	case r.State.NeedsDirs() && !m.dirsPresent(r.ID):
		m.log.Error("an active sandbox has lost its directories; GC purges it", "sandbox", r.ID)
		m.settle(r, errors.New("its upper or work directory is missing"), Errored, "")
	}
}

// settle moves r to state to when err is nil, else to Errored with err;
// prefix goes before the error text.
func (m *Manager) settle(r *record, err error, to State, prefix string) {
	c := *r
	if err != nil {
		to, c.Error = Errored, prefix+err.Error()
	}
	if merr := c.move(to); merr != nil {
		m.log.Error("cannot settle the sandbox", "sandbox", r.ID, "err", merr)
		return
	}
	if werr := m.save(&c); werr != nil {
		m.log.Error("cannot settle the sandbox", "sandbox", r.ID, "err", werr)
	}
}

func (m *Manager) dirsPresent(id string) bool {
	for _, d := range []string{m.upper(id), m.work(id), filepath.Join(m.work(id), layers.MetaFile)} {
		if _, err := os.Lstat(d); err != nil {
			return false
		}
	}
	return true
}

// mountAll mounts every active sandbox, parents before the sandboxes
// nested in them. A failure is logged; the sandbox stays active.
func (m *Manager) mountAll() {
	var act []record
	for _, r := range m.snapshot("") {
		if r.State == Active && m.mountOf(r.ID) == nil {
			act = append(act, r)
		}
	}
	order, err := commitOrder(act)
	if err != nil {
		m.log.Error("cannot order the sandboxes to mount", "err", err)
		order = act
	}
	for i := len(order) - 1; i >= 0; i-- {
		r := order[i]
		if err := m.detachStale(&r, true); err != nil {
			m.log.Warn("a stale mount could not be detached", "sandbox", r.ID, "err", err)
		}
		if err := m.mountSandbox(&r); err != nil {
			m.log.Error("cannot mount the sandbox; it stays active, unmounted", "sandbox", r.ID, "err", err)
		}
	}
}

// Close unmounts every sandbox this manager serves (they stay active; the
// next manager mounts them again) or, with DestroyOnExit, destroys every
// sandbox it created; then it releases the state root. A second Close
// does nothing and returns the first one's result.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.close() })
	return m.closeErr
}

func (m *Manager) close() error {
	orderEnter(levelLife)
	m.life.Lock()
	defer orderLeave(levelLife)
	defer m.life.Unlock()
	m.closed = true
	var errs []error
	if m.opt.DestroyOnExit {
		created := map[string]bool{}
		for _, id := range m.createdIDs() {
			created[id] = true
		}
		for _, r := range m.childrenFirst(m.snapshot("")) {
			if !created[r.ID] {
				continue
			}
			if err := m.destroyID(context.Background(), r.ID); err != nil {
				errs = append(errs, fmt.Errorf("destroy %s: %w", r.ID, err))
			}
		}
	}
	for _, r := range m.childrenFirst(m.snapshot("")) {
		if m.mountOf(r.ID) != nil {
			if err := m.unmountSandbox(&r, true); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", r.ID, err))
			}
		}
	}
	errs = append(errs, m.lock.Close())
	return errors.Join(errs...)
}

func (m *Manager) createdIDs() []string {
	unlock := m.lockRegistry()
	defer unlock()
	var ids []string
	for id := range m.created {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// StateRoot is the manager's resolved state root.
func (m *Manager) StateRoot() string { return m.root }

func (m *Manager) dir(id string) string   { return filepath.Join(m.root, "sandboxes", id) }
func (m *Manager) upper(id string) string { return filepath.Join(m.dir(id), "upper") }
func (m *Manager) work(id string) string  { return filepath.Join(m.dir(id), "work") }

// layersConfig is the sandbox's layers configuration, as its work
// directory records it.
func (m *Manager) layersConfig(id string) (layers.Config, error) {
	meta, err := layers.ReadMeta(m.work(id))
	if err != nil {
		return layers.Config{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return meta.Config(m.work(id)), nil
}

// get returns a copy of the record of id.
func (m *Manager) get(id string) (record, bool) {
	unlock := m.lockRegistry()
	defer unlock()
	r, ok := m.recs[id]
	if !ok {
		return record{}, false
	}
	return *r, true
}

// save writes r to disk, then makes it the registry's entry. The caller
// holds r's plan lock (or is New, before anyone else can call).
func (m *Manager) save(r *record) error {
	c := *r
	if err := writeRecord(m.dir(r.ID), &c); err != nil {
		return err
	}
	unlock := m.lockRegistry()
	m.recs[r.ID] = &c
	unlock()
	*r = c
	return nil
}

// snapshot copies the records of plan ("" for all), in List order.
func (m *Manager) snapshot(plan string) []record {
	unlock := m.lockRegistry()
	var rs []*record
	for _, r := range m.recs {
		if plan == "" || r.Plan == plan {
			rs = append(rs, r)
		}
	}
	out := make([]record, 0, len(rs))
	for _, r := range sortRecords(rs) {
		out = append(out, *r)
	}
	unlock()
	return out
}

// sortRecords orders records by creation time, then id: never map order.
func sortRecords(rs []*record) []*record {
	out := slices.Clone(rs)
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// since is a duration for logs.
func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }
