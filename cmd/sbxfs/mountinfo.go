package main

import "github.com/sbxfs/sbxfs/fsutil"

// fsType is the file system type of every sbxfs mount in mountinfo.
const fsType = "fuse.sbxfs"

// isSbxfs reports whether the entry is an sbxfs mount.
func isSbxfs(e *fsutil.MountEntry) bool { return e.FSType == fsType }

// sbxfsMountOf returns the sbxfs mount whose source is the work directory
// work, or nil.
func sbxfsMountOf(entries []fsutil.MountEntry, work string) *fsutil.MountEntry {
	for i := range entries {
		if isSbxfs(&entries[i]) && entries[i].Source == work {
			return &entries[i]
		}
	}
	return nil
}
