package fuse

import (
	"context"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// dirArgs resolves the directory node a namespace operation works in.
func (n *node) dirArgs() (string, layers.Obj, syscall.Errno) {
	rel, ok := n.rel()
	if !ok {
		return "", layers.Obj{}, syscall.ENOENT
	}
	return rel, n.getObj(), 0
}

var _ = (fusefs.NodeMkdirer)((*node)(nil))

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *gofuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	defer n.dirChanged()
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		return nil, errno
	}
	e, err := n.fs.layers.Mkdir(rel, obj, name, mode, n.fs.creator(ctx))
	if err != nil {
		return nil, n.fs.toErrno("mkdir", err)
	}
	return n.newChild(ctx, name, &e, out), 0
}

var _ = (fusefs.NodeMknoder)((*node)(nil))

func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *gofuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	defer n.dirChanged()
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		return nil, errno
	}
	e, err := n.fs.layers.Mknod(rel, obj, name, mode, dev, n.fs.creator(ctx))
	if err != nil {
		return nil, n.fs.toErrno("mknod", err)
	}
	return n.newChild(ctx, name, &e, out), 0
}

var _ = (fusefs.NodeSymlinker)((*node)(nil))

func (n *node) Symlink(ctx context.Context, target, name string, out *gofuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	defer n.dirChanged()
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		return nil, errno
	}
	e, err := n.fs.layers.Symlink(rel, obj, name, target, caller(ctx))
	if err != nil {
		return nil, n.fs.toErrno("symlink", err)
	}
	return n.newChild(ctx, name, &e, out), 0
}

var _ = (fusefs.NodeLinker)((*node)(nil))

func (n *node) Link(ctx context.Context, target fusefs.InodeEmbedder, name string, out *gofuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	defer n.dirChanged()
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		return nil, errno
	}
	trel, ok := t.rel()
	if !ok {
		// A tmpfile, or a file unlinked while open, linked back in
		// through /proc/self/fd: link its open upper descriptor.
		fd, upper := t.openFd()
		if fd < 0 || !upper {
			return nil, syscall.ENOENT
		}
		e, err := n.fs.layers.LinkFd(fd, rel, obj, name, caller(ctx))
		if err != nil {
			return nil, n.fs.toErrno("link", err)
		}
		return t.linked(&e, out), 0
	}
	t.mu.Lock()
	e, err := n.fs.layers.Link(trel, &t.obj, rel, obj, name, caller(ctx))
	var own, drop bool
	if err == nil {
		own, drop = t.linkedLocked()
	}
	t.mu.Unlock()
	if err != nil {
		return nil, n.fs.toErrno("link", err)
	}
	if !own {
		return t.linked(&e, out), 0
	}
	// t, a name of an original file with several links, was copied up
	// by the link (or before): both names become one new node with the
	// copy's number (the kernel looks t's name up again).
	if tname, tparent := t.Parent(); drop && tparent != nil {
		t.dropEntry(tparent, tname)
	}
	return n.newChild(ctx, name, &e, out), 0
}

// linked is the node of e, a new link to n: n itself, so that the kernel
// sees one inode under both names, with n's number (a copy-up by the link
// may have given n's object another one: see newChild).
func (n *node) linked(e *layers.Entry, out *gofuse.EntryOut) *fusefs.Inode {
	n.mu.Lock()
	n.last = keepAttrs(&e.Stat)
	n.linkedHere = true
	n.mu.Unlock()
	fillAttr(&out.Attr, &e.Stat, n.StableAttr().Ino)
	return n.EmbeddedInode()
}

var _ = (fusefs.NodeUnlinker)((*node)(nil))

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	defer n.dirChanged()
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		return errno
	}
	n.settleChild(name)
	return n.fs.toErrno("unlink", n.fs.layers.Unlink(rel, obj, name, caller(ctx)))
}

// settleChild moves the open read-only handles of the child name that
// still read the original file to its upper copy, while a path still
// leads there: once the name is unlinked or replaced, a handle that
// switched lazily could no longer find the copy, and would go on reading
// the original instead of what writers wrote.
func (n *node) settleChild(name string) {
	ch := n.GetChild(name)
	if ch == nil {
		return
	}
	cn, ok := ch.Operations().(*node)
	if !ok {
		return
	}
	cn.mu.Lock()
	var lower []*handle
	if cn.obj.Upper {
		for h := range cn.open {
			h.mu.RLock()
			if !h.upper {
				lower = append(lower, h)
			}
			h.mu.RUnlock()
		}
	}
	cn.mu.Unlock()
	for _, h := range lower {
		h.switchToUpper()
	}
}

var _ = (fusefs.NodeRmdirer)((*node)(nil))

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	defer n.fs.enter()()
	defer n.dirChanged()
	var err error
	defer func(release func(error)) { release(err) }(n.rmdirHold(name))
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		err = errno
		return errno
	}
	err = n.fs.layers.Rmdir(rel, obj, name, caller(ctx))
	if err == nil {
		emptied(n.GetChild(name))
	}
	return n.fs.toErrno("rmdir", err)
}

// emptied gives a directory rmdir removed the size ext4 gives it (0:
// ext4_rmdir empties it), for whoever holds it open; a directory a rename
// replaced keeps its size there, as on ext4.
func emptied(ch *fusefs.Inode) {
	if ch == nil {
		return
	}
	if cn, ok := ch.Operations().(*node); ok {
		cn.mu.Lock()
		cn.last.size = 0
		cn.mu.Unlock()
	}
}

var _ = (fusefs.NodeRenamer)((*node)(nil))

func (n *node) Rename(ctx context.Context, name string, newParent fusefs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	defer n.fs.enter()()
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	defer n.dirChanged()
	defer np.dirChanged()
	var err error
	defer func(release func(error)) { release(err) }(n.renameHold(name, np, newName, flags))
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		err = errno
		return errno
	}
	nrel, nobj, errno := np.dirArgs()
	if errno != 0 {
		err = errno
		return errno
	}
	if flags&unix.RENAME_EXCHANGE == 0 {
		np.settleChild(newName) // the object replaced, if any
	}
	// The moved node's Obj is updated in place when it is known (it is,
	// whenever the kernel looked it up); a scratch Obj serves otherwise.
	var src layers.Obj
	srcp := &src
	var moved *node
	if ch := n.GetChild(name); ch != nil {
		if cn, ok := ch.Operations().(*node); ok {
			cn.mu.Lock()
			srcp, moved = &cn.obj, cn
		}
	}
	err = n.fs.layers.Rename(rel, obj, name, srcp, nrel, nobj, newName, flags, caller(ctx))
	if moved != nil {
		moved.mu.Unlock()
		if err == nil {
			moved.reissue(np.EmbeddedInode(), newName) // go-fuse moves it there next
		}
	}
	return n.fs.toErrno("rename", err)
}
