package fuse

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// The mount negotiates FUSE_HANDLE_KILLPRIV_V2. Without it the kernel
// asks for security.capability before every write(2) to a file, to learn
// whether the write must remove it: a GETXATTR round trip a write, which
// made writing a file in 4 KiB writes ten times slower than on ext4,
// though the writes themselves go by passthrough. With it the kernel asks
// once, then marks the inode clean (S_NOSEC) until its attributes change,
// and leaves clearing the set-user-ID and set-group-ID bits to the server,
// which must do it where ext4 would:
//
//   - a WRITE with FUSE_WRITE_KILL_SUIDGID (the writer lacks CAP_FSETID);
//   - a SETATTR with FATTR_KILL_SUIDGID (a truncate by such a caller, or
//     a chown);
//   - a SETATTR that changes nothing: the kernel's file_remove_privs
//     before a write that goes by passthrough (sbxfs never sees the write
//     itself), or chown(-1, -1); the FUSE kernel code drops their
//     ATTR_KILL_* bits and sends what is left, which is nothing.
//
// Which bits go is the server's to decide, as the kernel does for ext4
// (withoutPrivileges). Capabilities (security.capability) need nothing
// here: the upper file's own filesystem removes them when the file is
// written, truncated or chowned, through the server or by passthrough.

// killsPrivileges reports whether a SETATTR asks the server to clear the
// set-user-ID and set-group-ID bits (see above).
func killsPrivileges(in *gofuse.SetAttrIn) bool {
	return in.Valid&gofuse.FATTR_KILL_SUIDGID != 0 || in.Valid&^(gofuse.FATTR_FH|gofuse.FATTR_LOCKOWNER) == 0
}

// withoutPrivileges returns the permission bits of a file (attributes st)
// after a write, truncate or chown by c that must clear privileges, and
// whether they changed: the set-user-ID bit goes; the set-group-ID bit
// goes from a group-executable file, and from any other when c is neither
// root nor in the file's group (as the kernel decides for ext4, since
// Linux 6.2).
func withoutPrivileges(st *unix.Stat_t, c layers.Caller) (uint32, bool) {
	m := st.Mode & 0o7777
	k := m &^ unix.S_ISUID
	if k&unix.S_ISGID != 0 && (k&unix.S_IXGRP != 0 || !(c.Uid == 0 || inGroup(c, st.Gid))) {
		k &^= unix.S_ISGID
	}
	return k, k != m
}

// inGroup reports whether the caller c is in group gid: its own group or
// one of the supplementary groups of its process (when it still runs).
func inGroup(c layers.Caller, gid uint32) bool {
	if c.Gid == gid {
		return true
	}
	if c.Pid == 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Pid))
	if err != nil {
		return false
	}
	want := strconv.FormatUint(uint64(gid), 10)
	for line := range strings.Lines(string(b)) {
		if groups, ok := strings.CutPrefix(line, "Groups:"); ok {
			return slices.Contains(strings.Fields(groups), want)
		}
	}
	return false
}

// killWrites marks the WRITE requests being served that carry
// FUSE_WRITE_KILL_SUIDGID, by their cancel channel: go-fuse's node API
// drops the write flags.
type killWrites struct{ m sync.Map }

func (r *rawFS) Write(cancel <-chan struct{}, in *gofuse.WriteIn, data []byte) (uint32, gofuse.Status) {
	if in.WriteFlags&gofuse.WRITE_KILL_SUIDGID != 0 && cancel != nil {
		r.kills.m.Store(cancel, struct{}{})
		defer r.kills.m.Delete(cancel)
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

// writeKills reports whether the WRITE served under ctx must clear the
// set-user-ID and set-group-ID bits first.
func (fs *filesystem) writeKills(ctx context.Context) bool {
	fc, ok := ctx.(*gofuse.Context)
	if !ok || fc.Cancel == nil {
		return false
	}
	_, ok = fs.kills.m.Load(fc.Cancel)
	return ok
}

// dropPrivileges clears the set-user-ID and set-group-ID bits of the file
// h writes to, before a write that must (the caller holds the freeze
// gate).
func (h *handle) dropPrivileges(ctx context.Context) syscall.Errno {
	_, errno := h.n.setattr(ctx, h, &gofuse.SetAttrIn{SetAttrInCommon: gofuse.SetAttrInCommon{Valid: gofuse.FATTR_KILL_SUIDGID}})
	return errno
}
