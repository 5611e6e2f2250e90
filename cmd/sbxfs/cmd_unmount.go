package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/manager"
)

// serverExitTimeout bounds the wait for the server after an unmount.
const serverExitTimeout = 10 * time.Second

func unmountCommand() *cli.Command {
	return &cli.Command{
		Name:      "unmount",
		Aliases:   []string{"umount"},
		Usage:     "unmount an sbxfs mount (its changes stay in its sandbox directory)",
		ArgsUsage: "MOUNTPOINT",
		Description: `Unmounts the sbxfs mount at MOUNTPOINT, also when its server has died, and
waits (up to 10 s) until the server has exited and flushed the journal.
The sandbox directory keeps the changes: 'sbxfs mount --upper DIR' shows
them again. A mount with open files is busy: close them, or use --lazy to
detach it now (the server exits when the last file is closed). So is one
that a process in another mount namespace works in (a copy of the mount
there, as CMD of 'sbxfs run --in-place' has). A copy nothing uses (a bind
mount of MOUNTPOINT, another namespace's made by unshare -m) is cut off:
it answers ENOTCONN there, and the server exits.

The mount of a managed sandbox ('sbxfs create') is unmounted by its
daemon, which knows it then: the sandbox stays active with its changes
('sbxfs list' shows it unmounted; commit, rollback and destroy still work);
'sbxfs mount ID' mounts it again, and so does the next daemon start. A
sandbox with another managed sandbox mounted on its mount is busy: unmount
that one first.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "lazy", Usage: "detach now even if files are open (umount -l)"},
		},
		OnUsageError: onUsageError,
		Action:       runUnmount,
	}
}

func runUnmount(c *cli.Context) error {
	args := c.Args().Slice()
	if err := checkArgs(c, args, 1, "MOUNTPOINT"); err != nil {
		return err
	}
	mnt, err := resolveMountpoint(args[0])
	if err != nil {
		return failf(exitBadPath, "mountpoint %q: %v; give the mountpoint's path", args[0], err)
	}
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return err
	}
	e := fsutil.MountAt(mounts, mnt)
	switch {
	case e == nil:
		return failf(exitNotSbxfs, "%s is not a mount point, so not an sbxfs mount; give the MOUNTPOINT of 'sbxfs mount'", mnt)
	case othersSbxfs(e) != "":
		return failf(exitNotSbxfs, "%s", othersSbxfs(e))
	case !isSbxfs(e):
		return failf(exitNotSbxfs, "%s is not an sbxfs mount (it is %s from %s); use umount(8) for it", mnt, e.FSType, e.Source)
	}
	lazy := c.Bool("lazy")
	if root, id := managedWork(e.Source); id != "" {
		// Served by the daemon: it unmounts and knows. Without a daemon the
		// mount is stale (or served by another process): unmounted below,
		// and the next daemon mounts the sandbox again.
		if d, err := manager.DialDaemon(root); err == nil {
			defer d.Close()
			return unmountManaged(d, root, id, mnt, lazy)
		}
	}
	if !lazy {
		if pids := fsutil.UsedElsewhere(e.Dev); len(pids) > 0 {
			return failf(exitBusy, "mount is busy: processes in another mount namespace use it (pid %s): end them, or use --lazy", joinInts(pids))
		}
	}
	// The connection is held before the unmount: after it, its device
	// number may name another mount's (fsutil.FuseConn).
	conn, _ := fsutil.OpenFuseConn(e.Dev)
	if conn != nil {
		defer conn.Close()
	}
	if err := unmount(mnt, lazy); err != nil {
		return err
	}
	if !lazy {
		cutOff(c, mnt, e.Dev, conn)
	}
	timeout := serverExitTimeout
	if lazy {
		timeout = 2 * time.Second // open files keep a detached server alive
	}
	if pid := waitServerExit(e.Source, timeout); pid != 0 {
		if lazy {
			fmt.Fprintf(c.App.ErrWriter, "sbxfs: %s is detached; its server (pid %d) exits once the last file open under it is closed\n", mnt, pid)
			return nil
		}
		return failf(exitInternal, "%s is unmounted but its server (pid %d) has not exited after %s; see %s", mnt, pid, timeout, serverLog(e.Source))
	}
	return nil
}

// cutOff ends the connection of the sbxfs file system with device number
// dev, just unmounted from mnt, where a bind mount or another mount
// namespace still holds it: its server finishes. conn is that connection,
// held since before the unmount (nil when it could not be opened: then by
// name, fsutil.CutOffFuse).
func cutOff(c *cli.Context, mnt string, dev uint64, conn *fsutil.FuseConn) {
	var cut bool
	var err error
	if conn != nil {
		cut, err = conn.CutOff(200 * time.Millisecond)
	} else {
		cut, err = fsutil.CutOffFuse(dev, 200*time.Millisecond)
	}
	switch {
	case err != nil:
		fmt.Fprintf(c.App.ErrWriter, "sbxfs: %s is unmounted, but its file system is still mounted elsewhere (a bind mount, or another mount namespace) and cutting it off failed: %v\n", mnt, err)
	case cut:
		fmt.Fprintf(c.App.ErrWriter, "sbxfs: %s was still mounted elsewhere (a bind mount, or a copy in another mount namespace): cut off, it answers ENOTCONN there\n", mnt)
	}
}

// unmount unmounts mnt: with umount2 as root, with fusermount3 otherwise.
func unmount(mnt string, lazy bool) error {
	var err error
	if os.Geteuid() == 0 {
		flags := 0
		if lazy {
			flags = unix.MNT_DETACH
		}
		err = unix.Unmount(mnt, flags)
		if err != nil {
			err = fmt.Errorf("umount %s: %w", mnt, err)
		}
	} else if lazy {
		err = fusermount("-u", "-z", mnt)
	} else {
		err = fusermount("-u", mnt)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EBUSY):
		return failf(exitBusy, "mount is busy: close the files open under %s, or use --lazy", mnt)
	case errors.Is(err, unix.EPERM):
		return failf(exitInternal, "%v; run as root or as the user who mounted it", err)
	}
	return failf(exitInternal, "%v; retry, or use --lazy", err)
}

// unmountManaged asks the daemon of root to unmount its sandbox id.
func unmountManaged(d *manager.Daemon, root, id, mnt string, lazy bool) error {
	err := d.Unmount(id, lazy)
	if err != nil && manager.ErrorCode(err) == manager.CodeBusy {
		return failf(exitBusy, "%v; if files are open under %s, close them and retry, or use --lazy", err, mnt)
	}
	return daemonFailure(err, root, exitInternal)
}
