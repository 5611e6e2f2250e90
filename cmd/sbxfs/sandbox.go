package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
	"github.com/sbxfs/sbxfs/manager"
)

// sandbox is a sandbox named on the command line, found on disk.
type sandbox struct {
	work  string
	meta  *layers.Meta
	cfg   layers.Config
	mount *fsutil.MountEntry // nil when not mounted
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
	if errors.Is(err, commit.ErrUndoLog) {
		return nil, failf(exitCommitFailed, "%v\nthe undo log %s of an interrupted commit is damaged, so sbxfs cannot tell what that commit changed; "+
			"check the original, then move the undo log away: the sandbox keeps its changes", err, filepath.Join(sb.work, commit.UndoLogName))
	}
	if err != nil {
		return nil, commitFailure(err)
	}
	if rec.Action != "none" {
		fmt.Fprintf(w, "sbxfs: an interrupted commit (%s) was %s\n", rec.ID, rec.Action)
	}
	return sb, nil
}

// needOriginal refuses, with what to do, a sandbox whose original is not
// where it was recorded (moved or removed): its changes cannot be listed
// or committed against it, and stay in the sandbox.
func (sb *sandbox) needOriginal() error {
	orig := sb.meta.Lowers[0]
	fi, err := os.Stat(orig)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if dir := filepath.Dir(sb.work); !manager.IsManagedDir(dir) {
			return failf(exitBadPath, "the original %s of this sandbox is missing (moved or removed?): put it back there and retry, or record its new place with 'sbxfs mount --moved --upper %s NEWPLACE MOUNTPOINT'; the sandbox keeps its changes", orig, dir)
		}
		return failf(exitBadPath, "the original %s of this sandbox is missing (moved or removed?): put it back there and retry, or record its new place with 'sbxfs mount --moved NEWPLACE %s'; the sandbox keeps its changes", orig, filepath.Base(filepath.Dir(sb.work)))
	case err != nil:
		return failf(exitBadPath, "the original of this sandbox: %v", err)
	case !fi.IsDir():
		return failf(exitBadPath, "the original %s of this sandbox is no longer a directory: put the directory back there and retry; the sandbox keeps its changes", orig)
	}
	return nil
}

// sandboxChanges finds the sandbox arg names (a mountpoint, a sandbox
// directory or, under the helper, its id) and computes its change set,
// refusing a sandbox whose original is gone: what diff and status show.
func sandboxChanges(c *cli.Context, arg string) (*sandbox, layers.ChangeSet, error) {
	arg, err := sandboxArg(c, arg)
	if err != nil {
		return nil, layers.ChangeSet{}, err
	}
	sb, err := lookupSandbox(arg)
	if err != nil {
		return nil, layers.ChangeSet{}, err
	}
	if err := sb.needOriginal(); err != nil {
		return nil, layers.ChangeSet{}, err
	}
	cs, err := layers.Changes(sb.cfg)
	if err != nil {
		return nil, layers.ChangeSet{}, journalHint(fmt.Errorf("compute the changes of %s: %w", sb.work, err), sb.work)
	}
	return sb, cs, nil
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
		if !fsutil.IsStaleMount(sb.mount.Mountpoint) {
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
	// (the kernel releases FUSE files asynchronously): retry briefly. The
	// server retries by itself for about 0.3 s (go-fuse), and keeps a
	// frozen mount frozen meanwhile: what a process does there waits, so
	// it is not asked again.
	var err error
	if ctl != nil {
		err = ctl.Unmount()
	}
	for delay := 20 * time.Millisecond; ctl == nil; delay *= 2 {
		err = unmount(sb.mount.Mountpoint, false)
		if err == nil || delay > time.Second || !sb.stillMounted() {
			break
		}
		time.Sleep(delay)
	}
	if err != nil && sb.stillMounted() {
		if errors.Is(err, unix.EBUSY) || exitCode(err) == exitBusy {
			if strings.Contains(err.Error(), "another mount namespace") {
				return &exitError{code: exitBusy, err: fmt.Errorf("%s is in use: %w", sb.mount.Mountpoint, err)}
			}
			return &exitError{code: exitBusy, err: fmt.Errorf("%s is in use (a file open or a working directory in it): %w", sb.mount.Mountpoint, unix.EBUSY)}
		}
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
	if err := fsutil.EmptyDir(sb.meta.Upper); err != nil {
		return err
	}
	return fsutil.EmptyDir(sb.work)
}

// resetOnDisk empties an unmounted sandbox but keeps it, as a mounted one
// is reset (layers.Reset): the upper emptied, its root given the
// original root's metadata again, the journal started anew, the record
// kept. Before 2026-11-27 the root kept the sandbox's mode and attributes.
func (sb *sandbox) resetOnDisk() error {
	l, err := layers.Open(sb.cfg)
	if err != nil {
		return err
	}
	if err := l.Reset(); err != nil {
		l.Close()
		return err
	}
	return l.Close()
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

// resetMounted empties the sandbox of the frozen mount ctl serves and lets
// changes through again, and returns once the server has thawed it and
// dropped the kernel's caches of the old sandbox: from then on the mount
// shows the empty sandbox. (Until 2026-11-27 the thaw was left to the
// control connection's end, which the server takes up after the command
// has exited: a stat right after `rollback --keep` could still show the
// attributes rolled back, and a write could still wait at the gate;
// TestKeptResetGivesTheRootBack failed so under load.)
func resetMounted(ctl *manager.Control) error {
	if err := ctl.Reset(); err != nil {
		return err
	}
	return ctl.Thaw()
}

// closeControl ends a command's control connection to a mount: it thaws the
// mount first (nothing when it is not frozen or no longer served), so a
// command that fails after freezing it returns once the mount takes
// changes again, not whenever the server notices the connection's end.
func closeControl(ctl *manager.Control) {
	_ = ctl.Thaw()
	_ = ctl.Close()
}

// lookupSandbox finds the sandbox arg names and whether it is mounted,
// without recovering anything (for read-only commands).
// sandboxArg is the argument naming a sandbox as lookupSandbox takes it:
// the id of a managed sandbox of the state root (not also a path) becomes
// its work directory; anything else stays.
func sandboxArg(c *cli.Context, arg string) (string, error) {
	if _, err := os.Lstat(arg); !manager.ValidID(arg) || !errors.Is(err, os.ErrNotExist) {
		return arg, nil
	}
	root, err := managedRoot(c)
	if err != nil {
		return "", err
	}
	if !manager.KnownSandbox(root, arg) {
		return "", failf(exitNotSbxfs, "no sandbox %s in %s, and no such path; see 'sbxfs list'", arg, root)
	}
	return manager.WorkDir(root, arg), nil
}

func lookupSandbox(arg string) (*sandbox, error) {
	mounts, err := fsutil.ReadMountinfo()
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
	if err := sb.uncover(mounts); err != nil {
		return nil, err
	}
	return sb, nil
}

// uncover has the sandbox read its original where 'sbxfs run --in-place'
// shows it (manager.InPlaceView) when, in this process's mount namespace (CMD's),
// the sandbox's own mount covers the original's path: read there, the
// "original" would be the sandbox itself, and its changes none.
func (sb *sandbox) uncover(mounts []fsutil.MountEntry) error {
	orig := sb.meta.Lowers[0]
	if e := fsutil.MountAt(mounts, orig); e == nil || !isSbxfs(e) || e.Source != sb.work {
		return nil
	}
	view := filepath.Join(filepath.Dir(sb.work), manager.InPlaceView)
	if fsutil.MountAt(mounts, view) == nil {
		return failf(exitBadPath, "here the sandbox's own mount covers its original %s (as in CMD's mount namespace of 'sbxfs run --in-place'), so the original cannot be read to compare: run this outside that namespace", orig)
	}
	sb.cfg.Lowers = append([]string{view}, sb.meta.Lowers[1:]...)
	return nil
}

// openSandboxAt reads the record of the sandbox whose work directory is work.
func openSandboxAt(work string) (*sandbox, error) {
	m, err := layers.ReadMeta(work)
	if err != nil {
		return nil, failf(exitNotSbxfs, "%v; is %s an sbxfs sandbox?", err, work)
	}
	if err := checkRecord(work, m); err != nil {
		return nil, err
	}
	return &sandbox{work: work, meta: m, cfg: m.Config(work)}, nil
}

// checkRecord refuses a sandbox record no sbxfs writes: the commands
// would read, write and (rollback, commit) empty whatever it names. Its
// layers are absolute, clean paths (sbxfs records them resolved), and
// the work directory and the upper are real directories, not symlinks.
func checkRecord(work string, m *layers.Meta) error {
	rec := filepath.Join(work, layers.MetaFile)
	for _, p := range append([]string{m.Upper}, m.Lowers...) {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return failf(exitNotSbxfs, "sandbox record %s names %q, which is not an absolute clean path: the record is damaged; restore it, or remove the sandbox directory", rec, p)
		}
	}
	if err := checkWorkFiles(work); err != nil {
		return err
	}
	for _, d := range []struct{ role, path string }{{"work directory", work}, {"upper directory", m.Upper}} {
		st, err := os.Lstat(d.path)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return failf(exitNotSbxfs, "%s %s: %v; check it and its permissions", d.role, d.path, err)
		case st.Mode()&os.ModeSymlink != 0:
			return failf(exitNotSbxfs, "the sandbox's %s %s is a symlink; sbxfs never makes one (it would work on whatever it points to): replace it by the real directory", d.role, d.path)
		case !st.IsDir():
			return failf(exitNotSbxfs, "the sandbox's %s %s is not a directory; restore it, or remove the sandbox directory", d.role, d.path)
		case d.path == work && int(st.Sys().(*syscall.Stat_t).Uid) != os.Geteuid():
			// Its record says which original the commit writes: another
			// user's record must not steer this user's commit. (The
			// upper's root takes the owner a chown of the mount's root
			// gives it: only the private work directory says whose the
			// sandbox is.)
			return failf(exitNotSbxfs, "the sandbox's %s %s belongs to uid %d, not to you: sbxfs works only on its caller's own sandboxes; run the command as that user",
				d.role, d.path, st.Sys().(*syscall.Stat_t).Uid)
		}
	}
	return nil
}

// stillMounted reports whether the sandbox's mount is still there (an
// unmount request can fail in its answer after the server went away).
func (sb *sandbox) stillMounted() bool {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return true
	}
	return sbxfsMountOf(mounts, sb.work) != nil
}

// workFiles are the files sbxfs keeps in a work directory by name; it
// makes none of them a symlink.
var workFiles = []string{layers.MetaFile, "journal", "commit.lock", commit.UndoLogName, "rebase.json",
	commitRecordName, pidFileName, "server.log", manager.ControlSocket}

// checkWorkFiles refuses a work directory where one of sbxfs's own files
// is a symlink: followed, it would have sbxfs read or write some other
// file.
func checkWorkFiles(work string) error {
	for _, name := range workFiles {
		p := filepath.Join(work, name)
		if st, err := os.Lstat(p); err == nil && st.Mode()&os.ModeSymlink != 0 {
			return failf(exitBadPath, "%s is a symlink; sbxfs never makes one there (followed, it would read or write another file): remove it", p)
		}
	}
	return nil
}

// journalHint adds what to do to an error that comes from a journal that
// is not one (overwritten, or damaged in its header).
func journalHint(err error, work string) error {
	if !errors.Is(err, layers.ErrJournalMagic) {
		return err
	}
	return &exitError{code: exitCode(err), err: fmt.Errorf("%w\nthe sandbox's journal %s is damaged, so its changes cannot be listed or committed; "+
		"'sbxfs rollback' discards them (the original is untouched)", err, filepath.Join(work, "journal"))}
}
