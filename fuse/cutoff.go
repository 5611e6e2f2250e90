package fuse

import (
	"fmt"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// cutOffWait bounds how long an unmount waits for the kernel to let go of
// the file system before it cuts the connection off (fsutil.CutOffFuse).
// The kernel ends an unreferenced file system before umount(2) returns;
// the wait covers a release that lags behind.
const cutOffWait = 200 * time.Millisecond

// mountedHere reports whether the mountpoint still shows the file system.
func (s *Server) mountedHere() bool {
	var st unix.Stat_t
	return unix.Stat(s.mnt, &st) == nil && st.Dev == s.stDev
}

// CutOff ends the mount's FUSE connection when its file system outlived
// the unmount of its mountpoint (fsutil.CutOffFuse), and reports whether
// it did: a bind mount, or a copy of the mount in another mount namespace,
// would keep the server serving, from a sandbox its commit or rollback
// empties, and the commit waiting for a server that does not finish. Call
// it only after a successful unmount, never after a lazy one.
func (s *Server) CutOff() bool {
	if s.stDev == 0 {
		return false
	}
	var cut bool
	var err error
	if s.conn != nil {
		cut, err = s.conn.CutOff(cutOffWait)
	} else {
		cut, err = fsutil.CutOffFuse(s.stDev, cutOffWait)
	}
	switch {
	case err != nil:
		s.fs.log.Warn("the mount's file system is still mounted elsewhere after its unmount, and cutting it off failed: the server serves it until it goes",
			"mountpoint", s.mnt, "err", err)
	case cut:
		s.fs.log.Warn("the mount's file system was still mounted elsewhere after its unmount (a bind mount, or a copy in another mount namespace): cut off, it answers ENOTCONN there",
			"mountpoint", s.mnt)
	}
	return cut
}

// InUseElsewhere fails with EBUSY when a process in another mount
// namespace uses the mount (fsutil.UsedElsewhere): a copy of it there
// (CMD's of 'sbxfs run --in-place', one made by unshare -m) keeps an
// unmount here from failing as busy, and CutOff would pull the file
// system from under that process. Call it before unmounting.
func (s *Server) InUseElsewhere() error {
	if s.stDev == 0 {
		return nil
	}
	if pids := fsutil.UsedElsewhere(s.stDev); len(pids) > 0 {
		return fmt.Errorf("unmount %s: %w: processes in another mount namespace use it (pid %s)", s.mnt, syscall.EBUSY, strings.Trim(fmt.Sprint(pids), "[]"))
	}
	return nil
}
