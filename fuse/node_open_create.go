package fuse

import (
	"context"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

var _ = (fusefs.NodeOpener)((*node)(nil))

func (n *node) Open(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	if write {
		defer n.fs.enter()() // (the gate before the names, as everywhere)
	}
	defer n.fs.names.shared()()
	if n.stale() {
		return nil, 0, syscall.ESTALE // the kernel opens the copy's node
	}
	rel, ok := n.rel()
	if !ok {
		return nil, 0, syscall.ENOENT
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	wasUpper := n.obj.Upper
	fd, upper, err := n.fs.layers.Open(rel, &n.obj, int(flags), caller(ctx))
	if err != nil {
		return nil, 0, n.fs.toErrno("open", err)
	}
	if write {
		if errno := n.fs.syncForDsync(flags); errno != 0 {
			unix.Close(fd)
			return nil, 0, errno
		}
	}
	if !wasUpper && upper && n.StableAttr().Gen != 0 {
		// The copy-up parted a name of an original file with several
		// links: the kernel's attributes of it (the original's link
		// count) are stale, and an open reply carries none. Dropped
		// before the reply, so no fstat after the open can see them
		// (sent from another goroutine, the drop could come after
		// one). Dropping attributes (offset -1) takes no lock the open
		// holds.
		_ = n.NotifyContent(-1, 0)
	}
	fh, fuseFlags := n.newHandleLocked(fd, upper)
	if write {
		n.fs.writers.add(fh.(fileHandle).h(), rel)
	}
	return fh, fuseFlags, 0
}

var _ = (fusefs.NodeCreater)((*node)(nil))

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *gofuse.EntryOut) (*fusefs.Inode, fusefs.FileHandle, uint32, syscall.Errno) {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	defer n.dirChanged()
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		return nil, nil, 0, errno
	}
	fd, e, err := n.fs.layers.Create(rel, obj, name, mode|unix.S_IFREG, n.fs.creator(ctx))
	if err != nil {
		return nil, nil, 0, n.fs.toErrno("create", err)
	}
	if errno := n.fs.syncForDsync(flags); errno != 0 {
		unix.Close(fd)
		return nil, nil, 0, errno
	}
	ino := n.newChild(ctx, name, &e, out)
	child, ok := ino.Operations().(*node)
	if !ok {
		unix.Close(fd)
		return nil, nil, 0, syscall.EIO
	}
	child.mu.Lock()
	defer child.mu.Unlock()
	fh, fuseFlags := child.newHandleLocked(fd, true)
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		n.fs.writers.add(fh.(fileHandle).h(), layers.Join(rel, name))
	}
	return ino, fh, fuseFlags, 0
}

// syncForDsync makes the journal durable for an open with O_SYNC or
// O_DSYNC (flags), so that the record of the copy-up or creation it just
// appended is on disk before the first write returns: through
// passthrough the kernel syncs the upper file itself and no fsync reaches
// the server, so a power cut after a synced write kept the file in the
// upper and lost it from the change set (found by a power-cut probe).
func (fs *filesystem) syncForDsync(flags uint32) syscall.Errno {
	if flags&unix.O_DSYNC == 0 { // O_SYNC holds the O_DSYNC bit
		return 0
	}
	return fs.toErrno("open O_DSYNC", fs.layers.Sync())
}

// newHandleLocked wraps fd in a handle. Upper files are served by FUSE
// passthrough when the kernel offers it, unless a handle without
// passthrough is still open on the node (the kernel refuses to mix the
// two). Lower files are never passthrough: the kernel keeps one backing
// file per inode and would reuse it for a later write open, sending writes
// to the original. Lower handles read through sbxfs instead, and switch to
// the upper copy once the file has been copied up.
func (n *node) newHandleLocked(fd int, upper bool) (fusefs.FileHandle, uint32) {
	h := &handle{n: n, fd: fd, upper: upper}
	if n.open == nil {
		n.open = map[*handle]bool{}
	}
	n.open[h] = true
	if upper && n.fs.passthrough && n.cached == 0 {
		return &ptFile{h}, 0
	}
	n.cached++
	h.counted = true
	if upper {
		return &cachedFile{h}, 0
	}
	return &cachedFile{h}, gofuse.FOPEN_KEEP_CACHE
}

var _ = (fusefs.NodeFsyncer)((*node)(nil))

// Fsync flushes a file through its handle, or a directory's upper copy,
// and makes the journal durable with it.
func (n *node) Fsync(ctx context.Context, f fusefs.FileHandle, flags uint32) syscall.Errno {
	defer n.fs.names.shared()()
	if h, ok := f.(fileHandle); ok {
		return h.h().fsync(flags)
	}
	if rel, ok := n.rel(); ok {
		fd, err := n.fs.layers.OpenUpperRaw(rel, unix.O_RDONLY|unix.O_DIRECTORY)
		if err == nil {
			err = unix.Fsync(fd)
			unix.Close(fd)
			if err != nil {
				return n.fs.toErrno("fsyncdir", err)
			}
		}
	}
	return n.fs.toErrno("fsync", n.fs.layers.Sync())
}

var _ = (fusefs.NodeTmpfiler)((*node)(nil))

// Tmpfile answers open(O_TMPFILE): an unnamed upper file; it enters the
// sandbox (and the journal) if it is linked in.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *gofuse.EntryOut) (*fusefs.Inode, fusefs.FileHandle, uint32, syscall.Errno) {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		return nil, nil, 0, errno
	}
	fd, e, err := n.fs.layers.Tmpfile(rel, obj, mode, n.fs.creator(ctx))
	if err != nil {
		return nil, nil, 0, n.fs.toErrno("tmpfile", err)
	}
	child := newNode(n.fs, e.Obj, unix.S_IFREG)
	ino := n.NewInode(ctx, child, fusefs.StableAttr{Mode: unix.S_IFREG, Ino: e.Stat.Ino})
	fillAttr(&out.Attr, &e.Stat, ino.StableAttr().Ino)
	cn, ok := ino.Operations().(*node)
	if !ok {
		unix.Close(fd)
		return nil, nil, 0, syscall.EIO
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	fh, fuseFlags := cn.newHandleLocked(fd, true)
	n.fs.writers.add(fh.(fileHandle).h(), "(tmpfile)")
	return ino, fh, fuseFlags, 0
}
