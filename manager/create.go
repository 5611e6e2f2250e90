package manager

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbxfs/sbxfs/layers"
)

// DefaultPlan is the plan of a sandbox created without one.
const DefaultPlan = "default"

// CreateOptions describe a new sandbox.
type CreateOptions struct {
	Plan       string // "" is DefaultPlan
	Name       string // free text for people
	Original   string // the directory the sandbox shows; required
	Mountpoint string // "" is StateRoot/mnt/<id>, made and removed by the manager
}

// Sandbox is what the manager knows of one sandbox.
type Sandbox struct {
	ID, Plan, Name, Original, Mountpoint string
	Dir                                  string // StateRoot/sandboxes/<id>, holding upper/ and work/
	State                                State
	Created                              time.Time
	Upper, Work                          string
	Mounted                              bool   // served by this manager
	Error                                string // why it is errored, or what its last operation left behind
}

func (m *Manager) view(r *record) Sandbox {
	return Sandbox{ID: r.ID, Plan: r.Plan, Name: r.Name, Original: r.Original, Mountpoint: r.Mountpoint,
		Dir: m.dir(r.ID), State: r.State, Created: r.Created, Upper: m.upper(r.ID), Work: m.work(r.ID),
		Mounted: m.mountOf(r.ID) != nil, Error: r.Error}
}

// Create makes a sandbox of o.Original: O(1) in the size of the original.
// With Options.Mount it is mounted when Create returns.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (Sandbox, error) {
	leave, err := m.enter()
	if err != nil {
		return Sandbox{}, err
	}
	defer leave()
	r, err := m.newRecord(o)
	if err != nil {
		return Sandbox{}, err
	}
	unlock, err := m.lockPlan(ctx, r.Plan)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if err := m.reserve(r); err != nil {
		return Sandbox{}, err
	}
	if err := m.build(r); err != nil {
		m.abandon(r)
		return Sandbox{}, fmt.Errorf("create a sandbox of %s: %w", r.Original, err)
	}
	m.log.Info("sandbox created", "sandbox", r.ID, "plan", r.Plan, "original", r.Original, "mountpoint", r.Mountpoint)
	return m.view(r), nil
}

// newRecord checks o and returns the record of the new sandbox (no id
// yet).
func (m *Manager) newRecord(o CreateOptions) (*record, error) {
	plan := o.Plan
	if plan == "" {
		plan = DefaultPlan
	}
	if err := checkPlan(plan); err != nil {
		return nil, err
	}
	if len(o.Name) > 256 || strings.ContainsAny(o.Name, "\x00\n") || !utf8.ValidString(o.Name) {
		return nil, fmt.Errorf("%w: the name must be one line of UTF-8 text, at most 256 bytes", ErrInvalid)
	}
	orig, err := resolveDir("original", o.Original)
	if err != nil {
		return nil, err
	}
	r := &record{Plan: plan, Name: o.Name, Original: orig, State: Pending, Created: time.Now().UTC()}
	if o.Mountpoint == "" {
		r.OwnMount = true
		return r, nil
	}
	if r.Mountpoint, err = resolveDir("mountpoint", o.Mountpoint); err != nil {
		return nil, err
	}
	return r, checkMountpoint(r.Mountpoint)
}

// reserve gives r a fresh id and enters it in the registry as pending,
// after checking it against every live sandbox: from here on GC knows
// its directory is not abandoned.
func (m *Manager) reserve(r *record) error {
	unlock := m.lockRegistry()
	defer unlock()
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		r.ID = hex.EncodeToString(b[:])
		if _, taken := m.recs[r.ID]; !taken && m.damaged[r.ID] == nil {
			break
		}
	}
	if r.OwnMount {
		r.Mountpoint = filepath.Join(m.root, "mnt", r.ID)
	}
	if err := m.checkPlacement(r); err != nil {
		return err
	}
	c := *r
	m.recs[r.ID] = &c
	m.created[r.ID] = true
	return nil
}

// build makes the sandbox's directories, records it, mounts it when the
// manager mounts, and makes it active.
func (m *Manager) build(r *record) error {
	if err := mkdirPrivate(m.dir(r.ID)); err != nil {
		return err
	}
	if err := m.save(r); err != nil {
		return err
	}
	for _, d := range []string{m.upper(r.ID), m.work(r.ID)} {
		if err := mkdirPrivate(d); err != nil {
			return err
		}
	}
	if r.OwnMount {
		if err := mkdirPrivate(r.Mountpoint); err != nil {
			return err
		}
	}
	cfg := layers.Config{Upper: m.upper(r.ID), Work: m.work(r.ID), Lowers: []string{r.Original}}
	if err := layers.Bind(&cfg); err != nil {
		return err
	}
	if m.opt.Mount {
		if err := m.mountSandbox(r); err != nil {
			return err
		}
	} else {
		// Open once: the upper root takes the original's attributes, and an
		// upper without xattr support is refused now rather than later.
		l, err := layers.Open(cfg)
		if err != nil {
			return err
		}
		if err := l.Close(); err != nil {
			return err
		}
	}
	if err := r.move(Active); err != nil {
		return err
	}
	return m.save(r)
}

// abandon undoes a creation that failed: whatever it made is removed and
// the id forgotten. What cannot be removed stays, errored, for GC.
func (m *Manager) abandon(r *record) {
	if m.mountOf(r.ID) != nil {
		if err := m.unmountSandbox(r, true); err != nil {
			m.log.Warn("cannot unmount a sandbox whose creation failed", "sandbox", r.ID, "err", err)
		}
	}
	err := os.RemoveAll(m.dir(r.ID))
	if r.OwnMount {
		if rerr := os.Remove(r.Mountpoint); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	if err != nil {
		m.log.Error("cannot remove a sandbox whose creation failed; GC will", "sandbox", r.ID, "err", err)
		r.Error = "creation failed; cleanup failed: " + err.Error()
		if m.moveSave(r, Errored) == nil {
			return
		}
	}
	unlock := m.lockRegistry()
	delete(m.recs, r.ID)
	delete(m.created, r.ID)
	unlock()
}

// Get returns the sandbox id.
func (m *Manager) Get(id string) (Sandbox, error) {
	r, ok := m.get(id)
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return m.view(&r), nil
}

// List returns the sandboxes of plan ("" for every plan), every state
// included, ordered by creation time, then id.
func (m *Manager) List(plan string) []Sandbox {
	rs := m.snapshot(plan)
	out := make([]Sandbox, 0, len(rs))
	for i := range rs {
		out = append(out, m.view(&rs[i]))
	}
	return out
}

// Config returns the layers configuration of sandbox id, to change an
// unmounted sandbox through layers.Open.
func (m *Manager) Config(id string) (layers.Config, error) {
	r, ok := m.get(id)
	if !ok {
		return layers.Config{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if !r.State.NeedsDirs() {
		return layers.Config{}, fmt.Errorf("%w: sandbox %s is %s", ErrNotActive, id, r.State)
	}
	return m.layersConfig(id)
}
