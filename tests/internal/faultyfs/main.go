// Command faultyfs serves a directory through FUSE (a go-fuse loopback)
// and fails every namespace change of a name that starts with "eio" with
// EIO, and of a name that starts with "eacces" with EACCES (rename to or
// from it, unlink, rmdir, mkdir, create, link, symlink, mknod) while
// faults are on: a real filesystem with real errors, for the commit tests'
// original. A lookup of a name that starts with "stall" waits while faults
// are on: a filesystem that stops answering.
//
//	faultyfs DIR MOUNTPOINT
//
// Faults start on; SIGUSR1 turns them off, SIGUSR2 on again. "ready" is
// printed on stdout once the mount is live; SIGTERM or SIGINT unmounts.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

var faults atomic.Bool

// failing returns the error an operation on names fails with, or 0.
func failing(names ...string) syscall.Errno {
	if !faults.Load() {
		return 0
	}
	for _, n := range names {
		switch {
		case strings.HasPrefix(n, "eio"):
			return syscall.EIO
		case strings.HasPrefix(n, "eacces"):
			return syscall.EACCES
		}
	}
	return 0
}

type node struct{ fs.LoopbackNode }

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	for strings.HasPrefix(name, "stall") && faults.Load() {
		time.Sleep(10 * time.Millisecond)
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if errno := failing(name, newName); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := failing(name); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := failing(name); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := failing(name); errno != 0 {
		return nil, errno
	}
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := failing(name); errno != 0 {
		return nil, errno
	}
	return n.LoopbackNode.Mknod(ctx, name, mode, dev, out)
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := failing(name); errno != 0 {
		return nil, nil, 0, errno
	}
	return n.LoopbackNode.Create(ctx, name, flags, mode, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := failing(name); errno != 0 {
		return nil, errno
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := failing(name); errno != 0 {
		return nil, errno
	}
	return n.LoopbackNode.Symlink(ctx, target, name, out)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: faultyfs DIR MOUNTPOINT")
		os.Exit(2)
	}
	faults.Store(true)
	var st syscall.Stat_t
	if err := syscall.Stat(os.Args[1], &st); err != nil {
		fmt.Fprintln(os.Stderr, "faultyfs:", err)
		os.Exit(1)
	}
	root := &fs.LoopbackRoot{Path: os.Args[1], Dev: st.Dev}
	root.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{fs.LoopbackNode{RootData: r}}
	}
	root.RootNode = root.NewNode(root, nil, "", &st)
	zero := time.Duration(0)
	server, err := fs.Mount(os.Args[2], root.RootNode, &fs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "faultyfs", Name: "faultyfs", DirectMount: true, AllowOther: true},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultyfs: mount:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for s := range sigs {
			switch s {
			case syscall.SIGUSR1:
				faults.Store(false)
			case syscall.SIGUSR2:
				faults.Store(true)
			default:
				_ = server.Unmount()
			}
		}
	}()
	server.Wait()
}
