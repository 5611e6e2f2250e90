package fuse

import (
	"context"
	"os"
	"sync"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hanwen/go-fuse/v2/splice"
	"golang.org/x/sys/unix"
)

// handle is an open file: a descriptor of the upper copy, or a read-only
// descriptor of the lower file.
type handle struct {
	n       *node
	mu      sync.RWMutex // guards fd and upper against the switch to the upper copy
	fd      int
	upper   bool
	counted bool // counted in n.cached
}

// fileHandle is implemented by both handle flavours.
type fileHandle interface{ h() *handle }

// cachedFile is a handle served through sbxfs (reads and writes reach the
// server); it does not offer a passthrough descriptor.
type cachedFile struct{ *handle }

// ptFile is an upper-file handle the kernel may serve by passthrough.
type ptFile struct{ *handle }

func (h *handle) h() *handle { return h }

var _ = (fusefs.FilePassthroughFder)((*ptFile)(nil))

func (f *ptFile) PassthroughFd() (int, bool) { return f.fd, true }

var (
	_ = (fusefs.FileReader)((*handle)(nil))
	_ = (fusefs.FileWriter)((*handle)(nil))
	_ = (fusefs.FileReleaser)((*handle)(nil))
	_ = (fusefs.FileFlusher)((*handle)(nil))
	_ = (fusefs.FileAllocater)((*handle)(nil))
	_ = (fusefs.FileLseeker)((*handle)(nil))
)

// switchToUpper moves a lower handle to the upper copy once the file has
// been copied up, so an open reader sees what later writers wrote, as on a
// plain filesystem.
func (h *handle) switchToUpper() {
	h.mu.RLock()
	upper := h.upper
	h.mu.RUnlock()
	if upper {
		return
	}
	h.n.mu.Lock()
	up := h.n.obj.Upper
	h.n.mu.Unlock()
	if !up {
		return
	}
	rel, ok := h.n.rel()
	if !ok {
		return
	}
	fd, err := h.n.fs.layers.OpenUpperRaw(rel, unix.O_RDONLY)
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.upper || h.fd < 0 {
		unix.Close(fd)
		return
	}
	unix.Close(h.fd)
	h.fd, h.upper = fd, true
}

func (h *handle) Read(ctx context.Context, buf []byte, off int64) (gofuse.ReadResult, syscall.Errno) {
	func() {
		defer h.n.fs.names.shared()()
		h.switchToUpper()
	}()
	h.mu.RLock()
	defer h.mu.RUnlock()
	if len(buf) >= spliceMin && len(buf) <= maxSpliced() {
		// Large reads go from the file to the kernel by splice(2), with
		// no copy through this process. The result outlives this call,
		// and the handle's descriptor may change (switchToUpper): it
		// reads through its own duplicate.
		if fd, err := unix.FcntlInt(uintptr(h.fd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			return &fdReadResult{fd: fd, off: off, sz: len(buf)}, 0
		}
	}
	n, err := unix.Pread(h.fd, buf, off)
	if err != nil {
		return nil, h.n.fs.toErrno("read", err)
	}
	return gofuse.ReadResultData(buf[:n]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	defer h.n.fs.enter()()
	if !h.upper {
		return 0, syscall.EBADF // lower handles are read-only
	}
	if h.n.fs.writeKills(ctx) {
		if errno := h.dropPrivileges(ctx); errno != 0 {
			return 0, errno
		}
	}
	n, err := unix.Pwrite(h.fd, data, off)
	return uint32(n), h.n.fs.toErrno("write", err)
}

func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.n.fs.writers.remove(h)
	h.mu.Lock()
	fd := h.fd
	h.fd = -1
	h.mu.Unlock()
	h.n.mu.Lock()
	delete(h.n.open, h)
	if h.counted {
		h.n.cached--
	}
	h.n.mu.Unlock()
	h.n.reissueHere()
	if fd < 0 {
		return syscall.EBADF
	}
	return h.n.fs.toErrno("release", unix.Close(fd))
}

// Flush has nothing to do (writes reach the upper file as they come, and
// locks are the kernel's): ENOSYS tells the kernel not to send FLUSH again,
// which saves a round trip on every close(2).
func (h *handle) Flush(ctx context.Context) syscall.Errno { return syscall.ENOSYS }

func (h *handle) fsync(flags uint32) syscall.Errno {
	var err error
	if flags&1 != 0 {
		err = unix.Fdatasync(h.fd)
	} else {
		err = unix.Fsync(h.fd)
	}
	if err != nil {
		return h.n.fs.toErrno("fsync", err)
	}
	return h.n.fs.toErrno("fsync", h.n.fs.layers.Sync())
}

func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	defer h.n.fs.enter()()
	if !h.upper {
		return syscall.EBADF
	}
	return h.n.fs.toErrno("fallocate", unix.Fallocate(h.fd, mode, int64(off), int64(size)))
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	h.switchToUpper()
	h.mu.RLock()
	defer h.mu.RUnlock()
	n, err := unix.Seek(h.fd, int64(off), int(whence))
	return uint64(n), h.n.fs.toErrno("lseek", err)
}

// Read: where devLoop serves the mount, a large read the handle serves
// from a descriptor is spliced to the kernel here (devLoop.spliceRead),
// and the ProtocolServer's empty reply to it is not written.
func (r *rawFS) Read(cancel <-chan struct{}, in *gofuse.ReadIn, buf []byte) (gofuse.ReadResult, gofuse.Status) {
	res, st := r.RawFileSystem.Read(cancel, in, buf)
	if fr, ok := res.(*fdReadResult); ok && st.Ok() && r.dev != nil && r.dev.spliceRead(in.Unique, fr.fd, fr.off, fr.sz) {
		fr.Done()
		return gofuse.ReadResultData(nil), gofuse.OK
	}
	return res, st
}

// spliceMin is the smallest read served by splice: below it, a copy costs
// less than the extra descriptor.
const spliceMin = 64 << 10

// maxSpliced is the largest read go-fuse can splice: the reply (header
// and data) and a spare page must fit in a pipe of the system's largest
// size (/proc/sys/fs/pipe-max-size, 1 MiB by default). A larger one
// would fail to splice, be logged, and be read again by copying.
func maxSpliced() int {
	return splice.MaxPipeSize() - 2*os.Getpagesize()
}

// maxRequest is the largest READ or WRITE the kernel sends: 1 MiB, less
// what keeps a READ of that size within maxSpliced.
func maxRequest() int {
	return max(min(1<<20, maxSpliced()&^(os.Getpagesize()-1)), 128<<10)
}

// fdReadResult is a read served from a descriptor of its own: go-fuse's
// loop, or devLoop through rawFS.Read, splices it to the kernel where it
// can (else it is read into the reply buffer); then Done closes the
// descriptor.
type fdReadResult struct {
	fd  int
	off int64
	sz  int
}

// Seekable is what go-fuse's splice path asks of a result.
func (r *fdReadResult) Seekable() (uintptr, int64, int) { return uintptr(r.fd), r.off, r.sz }

func (r *fdReadResult) Bytes(buf []byte) ([]byte, gofuse.Status) {
	n, err := unix.Pread(r.fd, buf[:min(len(buf), r.sz)], r.off)
	if err != nil {
		return nil, gofuse.ToStatus(err)
	}
	return buf[:n], gofuse.OK
}

func (r *fdReadResult) Size() int { return r.sz }

func (r *fdReadResult) Done() {
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}
