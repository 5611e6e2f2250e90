package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
	"github.com/sbxfs/sbxfs/manager"
)

// sandbox is a sandbox named on the command line, found on disk.
type sandbox struct {
	work  string
	meta  *layers.Meta
	cfg   layers.Config
	mount *mountEntry // nil when not mounted
}

// openSandbox finds the sandbox arg names (a mountpoint, a sandbox
// directory or a work directory) and finishes any interrupted commit of it
// first, saying so on w.
func openSandbox(arg string, w io.Writer) (*sandbox, error) {
	sb, err := lookupSandbox(arg)
	if err != nil {
		return nil, err
	}
	rec, err := commit.Recover(sb.cfg, commit.RecoverOptions{})
	if err != nil {
		return nil, commitFailure(err)
	}
	if rec.Action != "none" {
		fmt.Fprintf(w, "sbxfs: an interrupted commit (%s) was %s\n", rec.ID, rec.Action)
	}
	return sb, nil
}

// control connects to the process serving a mounted sandbox; nil (and no
// error) when the sandbox is not mounted or its server is gone (a stale
// mount changes nothing, so nothing needs freezing).
func (sb *sandbox) control() (*manager.Control, error) {
	if sb.mount == nil {
		return nil, nil
	}
	ctl, err := manager.DialControl(sb.work)
	if errors.Is(err, manager.ErrNoServer) {
		if _, serr := os.Stat(sb.mount.Mountpoint); serr == nil {
			return nil, failf(exitBusy, "%s is mounted but its server does not answer on %s; retry, or unmount it first", sb.mount.Mountpoint, filepath.Join(sb.work, manager.ControlSocket))
		}
		return nil, nil
	}
	return ctl, err
}

// end takes the mount down after a commit or rollback: through its server,
// or with umount(8) for a stale one. It waits for the server to exit.
func (sb *sandbox) end(ctl *manager.Control) error {
	if sb.mount == nil {
		return nil
	}
	// A file closed just before may still hold the mount for a moment
	// (the kernel releases FUSE files asynchronously): retry briefly.
	var err error
	for delay := 20 * time.Millisecond; ; delay *= 2 {
		if ctl != nil {
			err = ctl.Unmount()
		} else {
			err = unmount(sb.mount.Mountpoint, false)
		}
		if err == nil || delay > time.Second || !sb.stillMounted() {
			break
		}
		time.Sleep(delay)
	}
	if err != nil && sb.stillMounted() {
		return err
	}
	if pid := waitServerExit(sb.work, serverExitTimeout); pid != 0 {
		return failf(exitInternal, "%s is unmounted but its server (pid %d) has not exited", sb.mount.Mountpoint, pid)
	}
	return nil
}

// discard removes the sandbox's changes from disk: the whole sandbox
// directory of 'sbxfs mount --upper DIR', or the contents of the upper and
// the sandbox's files in the work directory of the helper form.
func (sb *sandbox) discard() error {
	dir := filepath.Dir(sb.work)
	if sb.meta.Upper == filepath.Join(dir, "upper") && filepath.Base(sb.work) == "work" {
		return os.RemoveAll(dir)
	}
	if err := emptyDir(sb.meta.Upper); err != nil {
		return err
	}
	return emptyDir(sb.work)
}

// resetOnDisk empties an unmounted sandbox but keeps it: upper emptied,
// journal removed, the record kept.
func (sb *sandbox) resetOnDisk() error {
	if err := emptyDir(sb.meta.Upper); err != nil {
		return err
	}
	err := os.Remove(filepath.Join(sb.work, "journal"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// freeze stops changes to a mounted sandbox, waiting up to wait for files
// open for writing to close.
func freeze(ctl *manager.Control, wait time.Duration) error {
	if ctl == nil {
		return nil
	}
	if err := ctl.Freeze(wait); err != nil {
		return failf(exitBusy, "%v; close them, or give --wait", err)
	}
	return nil
}

// lookupSandbox finds the sandbox arg names and whether it is mounted,
// without recovering anything (for read-only commands).
func lookupSandbox(arg string) (*sandbox, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	work, err := findSandbox(mounts, arg)
	if err != nil {
		return nil, err
	}
	sb, err := openSandboxAt(work)
	if err != nil {
		return nil, err
	}
	sb.mount = sbxfsMountOf(mounts, work)
	return sb, nil
}

// openSandboxAt reads the record of the sandbox whose work directory is work.
func openSandboxAt(work string) (*sandbox, error) {
	m, err := layers.ReadMeta(work)
	if err != nil {
		return nil, failf(exitNotSbxfs, "%v; is %s an sbxfs sandbox?", err, work)
	}
	return &sandbox{work: work, meta: m, cfg: m.Config(work)}, nil
}

// stillMounted reports whether the sandbox's mount is still there (an
// unmount request can fail in its answer after the server went away).
func (sb *sandbox) stillMounted() bool {
	mounts, err := readMountinfo()
	if err != nil {
		return true
	}
	return sbxfsMountOf(mounts, sb.work) != nil
}
