package fuse

import (
	"context"
	"sync"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/sbxfs/sbxfs/layers"
)

// The mount negotiates FUSE_DONT_MASK: the kernel then sends the mode a
// process asked for with its umask beside it, instead of the mode less the
// umask, and layers decides as ext4 does: a directory with a default ACL
// gives new objects their permissions from that ACL, ignoring the umask
// (posix_acl_create). go-fuse's node API drops the umask, so rawFS keeps it
// under the request's cancel channel, as it does the READDIR reply sizes,
// and creator finds it there.

// umasks holds the umask of each CREATE, MKDIR, MKNOD and TMPFILE being
// served, by the request's cancel channel.
type umasks struct{ m sync.Map }

// creator is caller for an operation that makes an object: with the umask
// the kernel sent for it.
func (fs *filesystem) creator(ctx context.Context) layers.Caller {
	c := caller(ctx)
	if fc, ok := ctx.(*gofuse.Context); ok && fc.Cancel != nil {
		if v, ok := fs.umasks.m.Load(fc.Cancel); ok {
			c.Umask = v.(uint32)
		}
	}
	return c
}

// withUmask runs op, the request under cancel, with its umask kept for
// creator.
func (r *rawFS) withUmask(cancel <-chan struct{}, umask uint32, op func() gofuse.Status) gofuse.Status {
	r.umasks.m.Store(cancel, umask)
	defer r.umasks.m.Delete(cancel)
	return op()
}

func (r *rawFS) Create(cancel <-chan struct{}, in *gofuse.CreateIn, name string, out *gofuse.CreateOut) gofuse.Status {
	return r.withUmask(cancel, in.Umask, func() gofuse.Status { return r.RawFileSystem.Create(cancel, in, name, out) })
}

func (r *rawFS) Tmpfile(cancel <-chan struct{}, in *gofuse.CreateIn, out *gofuse.CreateOut) gofuse.Status {
	return r.withUmask(cancel, in.Umask, func() gofuse.Status { return r.RawFileSystem.Tmpfile(cancel, in, out) })
}

func (r *rawFS) Mkdir(cancel <-chan struct{}, in *gofuse.MkdirIn, name string, out *gofuse.EntryOut) gofuse.Status {
	return r.withUmask(cancel, in.Umask, func() gofuse.Status { return r.RawFileSystem.Mkdir(cancel, in, name, out) })
}

func (r *rawFS) Mknod(cancel <-chan struct{}, in *gofuse.MknodIn, name string, out *gofuse.EntryOut) gofuse.Status {
	return r.withUmask(cancel, in.Umask, func() gofuse.Status { return r.RawFileSystem.Mknod(cancel, in, name, out) })
}
