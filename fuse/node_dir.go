package fuse

import (
	"context"
	"sync"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

var _ = (fusefs.NodeOpendirHandler)((*node)(nil))

// OpendirHandle lets the kernel cache the listing (FOPEN_CACHE_DIR): it
// drops the cache itself whenever the directory changes through the mount,
// and sbxfs is the only writer of the upper. The listing is read on the
// first readdir, not at open, so a cached directory costs no listing.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	return &lazyDir{n: n}, gofuse.FOPEN_CACHE_DIR | gofuse.FOPEN_KEEP_CACHE, 0
}

// lazyDir is an open directory whose merged listing is made on first use.
type lazyDir struct {
	n  *node
	mu sync.Mutex
	ds fusefs.DirStream
}

var (
	_ = (fusefs.FileReaddirenter)((*lazyDir)(nil))
	_ = (fusefs.FileSeekdirer)((*lazyDir)(nil))
	_ = (fusefs.FileFsyncdirer)((*lazyDir)(nil))
)

func (d *lazyDir) stream(ctx context.Context) (fusefs.DirStream, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ds == nil {
		ds, errno := d.n.Readdir(ctx)
		if errno != 0 {
			return nil, errno
		}
		d.ds = ds
	}
	return d.ds, 0
}

func (d *lazyDir) Readdirent(ctx context.Context) (*gofuse.DirEntry, syscall.Errno) {
	ds, errno := d.stream(ctx)
	if errno != 0 || !ds.HasNext() {
		return nil, errno
	}
	e, errno := ds.Next()
	return &e, errno
}

func (d *lazyDir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	ds, errno := d.stream(ctx)
	if errno != 0 {
		return errno
	}
	if sd, ok := ds.(fusefs.FileSeekdirer); ok {
		return sd.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *lazyDir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.Fsync(ctx, nil, flags)
}
