package fuse

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// gate lets a commit stop every change to the sandbox: mutating
// operations hold it shared; Freeze holds it exclusively.
type gate struct {
	mu     sync.RWMutex
	frozen bool // guarded by Server.freezeMu
}

// enter is called at the start of every mutating operation; the returned
// function ends it.
func (fs *filesystem) enter() func() {
	fs.gate.mu.RLock()
	return fs.gate.mu.RUnlock
}

// writers are the handles open for writing. Writes through passthrough and
// shared mmaps never reach sbxfs, so a commit waits for them to close.
type writers struct {
	mu     sync.Mutex
	m      map[*handle]string
	closed chan struct{} // closed (and dropped) when a writer goes away
}

func (w *writers) add(h *handle, rel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[*handle]string{}
	}
	w.m[h] = rel
}

func (w *writers) remove(h *handle) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.m[h]; !ok {
		return
	}
	delete(w.m, h)
	if w.closed != nil {
		close(w.closed)
		w.closed = nil
	}
}

// waitable returns the paths open for writing and a channel closed when
// one of those handles goes away.
func (w *writers) waitable() ([]string, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed == nil {
		w.closed = make(chan struct{})
	}
	return w.pathsLocked(), w.closed
}

func (w *writers) pathsLocked() []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range w.m {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// BusyError says files are still open for writing in a sandbox.
type BusyError struct{ Paths []string }

func (e *BusyError) Error() string {
	return fmt.Sprintf("files are open for writing in the sandbox: %s", strings.Join(e.Paths, ", "))
}

// releaseGrace is the least time Freeze waits for writers to go away.
const releaseGrace = 250 * time.Millisecond

// ErrNotFrozen is returned by Reset on a mount that is not frozen.
var ErrNotFrozen = errors.New("the sandbox is not frozen")

// Freeze stops every change to the sandbox: operations that would change
// it wait until Thaw. Files still open for writing make it fail with a
// *BusyError naming them, after waiting up to wait for them to close.
func (s *Server) Freeze(wait time.Duration) error {
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()
	if s.fs.gate.frozen {
		return nil
	}
	s.fs.gate.mu.Lock()
	// The kernel releases a closed file asynchronously: a file closed just
	// before the freeze may still be counted for a moment.
	deadline := time.Now().Add(max(wait, releaseGrace))
	for {
		busy, closed := s.fs.writers.waitable()
		if len(busy) == 0 {
			break
		}
		left := time.Until(deadline)
		if left <= 0 {
			s.fs.gate.mu.Unlock()
			return &BusyError{Paths: busy}
		}
		t := time.NewTimer(left)
		select {
		case <-closed:
		case <-t.C:
		}
		t.Stop()
	}
	s.fs.gate.frozen = true
	s.layers.SetShared(true) // a commit may change the upper now
	return s.layers.Sync()
}

// Sync makes what the sandbox holds durable: its upper layer's
// filesystem (syncfs) and its journal. A syncfs of the mount does not
// reach this server (the kernel sends FUSE_SYNCFS to virtiofs only), so
// a commit into this mount (a nested sandbox's) asks for it (the control
// socket's "sync") before it counts as done.
func (s *Server) Sync() error {
	fd, err := unix.Open(s.layers.UpperDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync the upper: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync the upper: %w", err)
	}
	return s.layers.Sync()
}

// Thaw lets changes through again, then drops the kernel's cached entries
// and pages if a Reset made them stale (not before: an operation waiting
// at the gate may hold a directory lock the invalidation needs).
func (s *Server) Thaw() {
	s.freezeMu.Lock()
	inval := s.invalidate
	s.invalidate = false
	if s.fs.gate.frozen {
		s.layers.SetShared(false)
		s.fs.gate.frozen = false
		s.fs.gate.mu.Unlock()
	}
	s.freezeMu.Unlock()
	if inval {
		invalidate(s.fs.root)
	}
}

// Reset discards the sandbox's changes while it stays mounted (after a
// commit or rollback with --keep): the upper and the journal start empty,
// every known node is looked up again and the kernel's caches are dropped.
// The mount must be frozen; it stays frozen.
func (s *Server) Reset() error {
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()
	if !s.fs.gate.frozen {
		return ErrNotFrozen
	}
	if err := s.layers.Reset(); err != nil {
		return err
	}
	root, err := s.layers.Root()
	if err != nil {
		return err
	}
	s.fs.root.mu.Lock()
	s.fs.root.obj = root.Obj
	s.fs.root.mu.Unlock()
	s.fs.root.forgetListing()
	s.refresh(s.fs.root, "", root.Obj)
	s.invalidate = true
	return nil
}

// refresh gives every known child of n its state in the reset overlay.
func (s *Server) refresh(n *node, rel string, obj layers.Obj) {
	for name, ch := range n.Children() {
		cn, ok := ch.Operations().(*node)
		if !ok {
			continue
		}
		crel := layers.Join(rel, name)
		e, err := s.layers.Lookup(rel, obj, name)
		cn.mu.Lock()
		if err == nil {
			cn.obj = e.Obj
		} else {
			cn.obj = layers.Obj{}
		}
		cn.mu.Unlock()
		cn.forgetListing()
		if err == nil && e.IsDir() {
			s.refresh(cn, crel, e.Obj)
		}
	}
}

// invalidate drops the kernel's cached entries below n, the pages of the
// files it knows and the listings of the directories (n's too).
func invalidate(n *node) {
	_ = n.NotifyContent(0, 0)
	for name, ch := range n.Children() {
		if cn, ok := ch.Operations().(*node); ok && ch.IsDir() {
			invalidate(cn)
		}
		_ = n.NotifyEntry(name)
		if !ch.IsDir() {
			_ = ch.NotifyContent(0, 0)
		}
	}
}

var _ = fusefs.InodeEmbedder((*node)(nil))
