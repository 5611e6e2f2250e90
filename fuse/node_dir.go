package fuse

import (
	"context"
	"sync"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

var _ = (fusefs.NodeOpendirHandler)((*node)(nil))

// OpendirHandle opens a directory whose listing is read on the first
// readdir, not at open.
//
// The kernel's listing cache (FOPEN_CACHE_DIR) is not used: with many
// processes changing one directory while others list it, a listing served
// from that cache now and then missed a name just created or showed one
// just removed (TestRealConcurrentWriters, about one run in six at 300
// operations a writer; never without the cache). Warm walks pay for it:
// every readdir comes to sbxfs (see docs/bench/README.md).
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	return &lazyDir{n: n}, 0, 0
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
