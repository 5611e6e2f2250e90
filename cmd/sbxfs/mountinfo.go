package main

import (
	"fmt"

	"github.com/sbxfs/sbxfs/fsutil"
)

// fsType is the file system type of every sbxfs mount in mountinfo.
const fsType = "fuse.sbxfs"

// isSbxfs reports whether the entry is an sbxfs mount of the caller's.
// Anyone may mount a FUSE file system of this type with any source name
// (fusermount3), and the source names the sandbox every command acts on:
// another user's mount is never taken for one (until 2026-11-28 a user's
// own mount naming root's sandbox had root's rollback remove it, and one
// naming a forged record had root's 'run' commit into any directory;
// found by review).
func isSbxfs(e *fsutil.MountEntry) bool { return e.FSType == fsType && e.MountedByMe() }

// othersSbxfs says, for an sbxfs mount that is not the caller's, whose it
// is and what to do; "" for any other entry.
func othersSbxfs(e *fsutil.MountEntry) string {
	if e == nil || e.FSType != fsType || e.MountedByMe() {
		return ""
	}
	uid, _ := e.FUSEUser()
	return fmt.Sprintf("%s is an sbxfs mount of another user (uid %d): sbxfs acts only on its caller's own mounts; run the command as that user", e.Mountpoint, uid)
}

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
