package fsutil

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// OrdersDataBeforeRename reports whether the filesystem holding dir
// commits a file's data no later than a rename made after writeback of
// that data has started ([StartWriteback]): ext4 with a journal, in
// data=ordered (the default) or data=journal mode. There, a transaction
// that allocates blocks for written data lists the file as ordered data,
// and the journal writes that data before it commits the transaction, or
// any later one, such as the rename's. ext4's own safeguard for
// replace-by-rename (auto_da_alloc) relies on the same ordering.
//
// Everywhere else (no journal, data=writeback, other filesystems) it
// reports false, and a file must be fsynced before it is renamed into
// place to be whole after a crash.
func OrdersDataBeforeRename(dir string) bool {
	var sfs unix.Statfs_t
	if unix.Statfs(dir, &sfs) != nil || sfs.Type != unix.EXT4_SUPER_MAGIC {
		return false
	}
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return false
	}
	// /sys/dev/block/MAJ:MIN names the block device, which names the
	// filesystem's entry in /proc/fs/ext4; ext4 lists a data= mode there
	// only when it has a journal.
	dev, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return false
	}
	f, err := os.Open(filepath.Join("/proc/fs/ext4", filepath.Base(dev), "options"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if opt := sc.Text(); opt == "data=ordered" || opt == "data=journal" {
			return true
		}
	}
	return false
}

// StartWriteback starts writing the dirty data of the file fd to disk,
// without waiting for it. On a filesystem that OrdersDataBeforeRename,
// that makes the data reach the disk no later than a rename made after.
func StartWriteback(fd int) error {
	if err := unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE); err != nil {
		return fmt.Errorf("start writeback: %w", err)
	}
	return nil
}
