package fuse

import (
	"context"
	"strings"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
)

var _ = (fusefs.NodeGetxattrer)((*node)(nil))

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	defer n.fs.names.shared()()
	rel, fd, errno := n.target()
	if errno != 0 {
		return 0, errno
	}
	var sz int
	var err error
	if fd >= 0 {
		sz, err = n.fs.layers.GetxattrFd(fd, attr, dest)
	} else {
		sz, err = n.fs.layers.Getxattr(rel, n.getObj(), attr, dest)
	}
	if err != nil {
		return 0, n.fs.toErrno("getxattr", err)
	}
	return uint32(sz), 0
}

var _ = (fusefs.NodeListxattrer)((*node)(nil))

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	defer n.fs.names.shared()()
	rel, fd, errno := n.target()
	if errno != 0 {
		return 0, errno
	}
	var names []string
	var err error
	if fd >= 0 {
		names, err = n.fs.layers.ListxattrFd(fd)
	} else {
		names, err = n.fs.layers.Listxattr(rel, n.getObj())
	}
	if err != nil {
		return 0, n.fs.toErrno("listxattr", err)
	}
	var b strings.Builder
	for _, name := range names {
		b.WriteString(name)
		b.WriteByte(0)
	}
	if len(dest) == 0 {
		return uint32(b.Len()), 0
	}
	if b.Len() > len(dest) {
		return uint32(b.Len()), syscall.ERANGE
	}
	return uint32(copy(dest, b.String())), 0
}

var _ = (fusefs.NodeSetxattrer)((*node)(nil))

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	rel, fd, errno := n.mutableTarget()
	if errno != 0 {
		return errno
	}
	if fd >= 0 {
		return n.fs.toErrno("setxattr", n.fs.layers.SetxattrFd(fd, attr, data, int(flags)))
	}
	n.mu.Lock()
	err := n.fs.layers.Setxattr(rel, &n.obj, attr, data, int(flags), caller(ctx))
	n.mu.Unlock()
	if err == nil {
		n.reissueHere()
	}
	return n.fs.toErrno("setxattr", err)
}

var _ = (fusefs.NodeRemovexattrer)((*node)(nil))

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	rel, fd, errno := n.mutableTarget()
	if errno != 0 {
		return errno
	}
	if fd >= 0 {
		return n.fs.toErrno("removexattr", n.fs.layers.RemovexattrFd(fd, attr))
	}
	n.mu.Lock()
	err := n.fs.layers.Removexattr(rel, &n.obj, attr, caller(ctx))
	n.mu.Unlock()
	if err == nil {
		n.reissueHere()
	}
	return n.fs.toErrno("removexattr", err)
}
