package manager

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/fuse"
)

// mount is a sandbox this manager serves in-process.
type mount struct {
	srv  *fuse.Server
	ctl  *ControlServer
	done chan struct{} // closed once the server's Wait returned
}

// controller is whoever serves a sandbox: this process (a *fuse.Server)
// or another one over the control socket.
type controller interface {
	Freeze(wait time.Duration) error
	Thaw()
	Reset() error
	Unmount() error
	Sync() error
}

// remote adapts a control connection to controller.
type remote struct{ c *Control }

func (r remote) Freeze(wait time.Duration) error { return r.c.Freeze(wait) }
func (r remote) Thaw()                           { _ = r.c.Thaw() }
func (r remote) Reset() error                    { return r.c.Reset() }
func (r remote) Unmount() error                  { return r.c.Unmount() }
func (r remote) Sync() error                     { return r.c.Sync() }

// originalThere refuses (ErrOriginalMissing) a sandbox whose original is
// not a directory where it was recorded any more (moved or removed).
func originalThere(r *record) error {
	if fi, err := os.Stat(r.Original); err != nil || !fi.IsDir() {
		return fmt.Errorf("%w: %s is not there (moved or removed?): put it back there and retry; the sandbox keeps its changes", ErrOriginalMissing, r.Original)
	}
	return nil
}

// unmountWait bounds the wait for a server to finish after its unmount.
const unmountWait = 10 * time.Second

// mountSandbox mounts r in this process and serves its control socket.
func (m *Manager) mountSandbox(r *record) error {
	if err := originalThere(r); err != nil {
		return err
	}
	if err := noSymlinkTo(r.Mountpoint); err != nil {
		return err
	}
	cfg, err := m.layersConfig(r.ID)
	if err != nil {
		return err
	}
	srv, err := fuse.Mount(fuse.Config{Layers: cfg, Mountpoint: r.Mountpoint, FsName: cfg.Work, Logger: m.log, NoIOUring: m.opt.NoIOUring})
	if err != nil {
		return err
	}
	m.log.Info("sandbox mounted", "sandbox", r.ID, "mountpoint", r.Mountpoint, "transport", srv.Transport())
	ctl, err := ServeControl(cfg.Work, srv)
	if err != nil {
		_ = srv.Unmount()
		_ = srv.Wait()
		return fmt.Errorf("serve the control socket: %w", err)
	}
	mt := &mount{srv: srv, ctl: ctl, done: make(chan struct{})}
	unlock := m.lockRegistry()
	m.mounts[r.ID] = mt
	unlock()
	go m.serveUntilUnmounted(r.ID, mt)
	return nil
}

// serveUntilUnmounted waits for the mount to go away (unmounted by the
// manager or from outside) and forgets it.
func (m *Manager) serveUntilUnmounted(id string, mt *mount) {
	if err := mt.srv.Wait(); err != nil {
		m.log.Warn("closing the sandbox journal failed", "sandbox", id, "err", err)
	}
	_ = mt.ctl.Close()
	unlock := m.lockRegistry()
	if m.mounts[id] == mt {
		delete(m.mounts, id)
	}
	unlock()
	close(mt.done)
}

func (m *Manager) mountOf(id string) *mount {
	unlock := m.lockRegistry()
	defer unlock()
	return m.mounts[id]
}

// controller returns whoever serves r, or nil when nobody does. close
// ends a remote connection (which thaws what it froze).
func (m *Manager) controller(r *record) (ctl controller, close func(), err error) {
	if mt := m.mountOf(r.ID); mt != nil {
		return mt.srv, func() {}, nil
	}
	c, err := DialControl(m.work(r.ID))
	if errors.Is(err, ErrNoServer) || errors.Is(err, os.ErrNotExist) {
		return nil, func() {}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return remote{c}, func() { _ = c.Close() }, nil
}

// unmountSandbox takes r's mount down: the in-process server, a remote
// server, or a stale mount whose server is gone. lazy detaches a busy
// mount instead of failing.
func (m *Manager) unmountSandbox(r *record, lazy bool) error {
	if mt := m.mountOf(r.ID); mt != nil {
		err := mt.srv.Unmount() // a busy mount stays frozen, if it was
		if err != nil && lazy {
			m.log.Warn("the mount is busy; detaching it lazily", "sandbox", r.ID, "err", err)
			mt.srv.Thaw() // what still uses it must not wait at the gate
			err = lazyDetach(r.Mountpoint)
		}
		if err != nil {
			return err
		}
		select {
		case <-mt.done:
		case <-time.After(unmountWait):
			m.log.Warn("the sandbox's server has not finished after its unmount", "sandbox", r.ID)
		}
		return nil
	}
	ctl, closeCtl, err := m.controller(r)
	if err != nil {
		return err
	}
	defer closeCtl()
	if ctl != nil {
		if err := ctl.Unmount(); err != nil && !lazy {
			return err
		}
	}
	return m.detachStale(r, lazy)
}

// detachStale unmounts whatever is still mounted at r's mountpoint from
// r's work directory (a server that died leaves such a mount behind).
func (m *Manager) detachStale(r *record, lazy bool) error {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return err
	}
	for _, e := range mounts {
		if e.Mountpoint != r.Mountpoint || e.Source != m.work(r.ID) || !ownSbxfs(&e) {
			continue
		}
		if err := lazyDetach(e.Mountpoint); err != nil && lazy {
			return err
		}
	}
	return nil
}

// ownSbxfs reports whether e is an sbxfs mount this process's user made.
// Anyone may mount a FUSE file system with any type and source name
// (fusermount3): another user's mount naming one of this manager's work
// directories is not that sandbox's, and is neither detached nor taken
// for a server of it.
func ownSbxfs(e *fsutil.MountEntry) bool { return e.FSType == "fuse.sbxfs" && e.MountedByMe() }

// lazyDetach detaches mnt now; the kernel ends the mount once nothing
// uses it.
func lazyDetach(mnt string) error {
	if os.Geteuid() == 0 {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach %s: %w", mnt, err)
		}
		return nil
	}
	out, err := exec.Command("fusermount3", "-u", "-z", mnt).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fusermount3 -u -z %s: %v: %s", mnt, err, strings.TrimSpace(string(out)))
	}
	return nil
}
