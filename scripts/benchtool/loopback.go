package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The fuse-loopback target is go-fuse's own loopback file system
// (fs.NewLoopbackRoot) serving the tree the ext4 target works on: each
// request forwarded to the same call on the tree, with no layers, no
// journal and no checks, through the library sbxfs is built on, with
// the kernel-side options sbxfs mounts with (cache timeouts of 30 s,
// default_permissions, passthrough of open files). It is the cost of a
// FUSE round trip with a server that does next to nothing: a reference
// for what no FUSE server can go below, not a peer with a target.
//
// It runs in a child process of the benchmark (serveLoopbackFlag), as
// sbxfs and fuse-overlayfs serve theirs: a process serving a mount must
// not also be the one using it.
const serveLoopbackFlag = "--serve-loopback"

// loopback is a running fuse-loopback server.
type loopback struct {
	mnt  string
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan error
}

// startLoopback serves tree at mnt and returns once it is mounted.
func startLoopback(tree, mnt string) (*loopback, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	l := &loopback{mnt: mnt, cmd: exec.Command(self, serveLoopbackFlag, tree, mnt), out: &bytes.Buffer{}, done: make(chan error, 1)}
	l.cmd.Stdout, l.cmd.Stderr = l.out, l.out
	if err := l.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { l.done <- l.cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); !isMountpoint(mnt); time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-l.done:
			return nil, fmt.Errorf("fuse-loopback of %s exited before mounting it (%v): %s", tree, err, strings.TrimSpace(l.out.String()))
		default:
		}
		if time.Now().After(deadline) {
			l.cmd.Process.Kill()
			<-l.done
			return nil, fmt.Errorf("fuse-loopback did not mount %s", mnt)
		}
	}
	return l, nil
}

// stop unmounts the mount and waits for its server to exit.
func (l *loopback) stop() error {
	var err error
	if isMountpoint(l.mnt) {
		err = unmountRetry(l.mnt)
	}
	select {
	case werr := <-l.done:
		if werr != nil {
			err = errors.Join(err, fmt.Errorf("fuse-loopback of %s: %v: %s", l.mnt, werr, strings.TrimSpace(l.out.String())))
		}
	case <-time.After(10 * time.Second):
		l.cmd.Process.Kill()
		<-l.done
		err = errors.Join(err, fmt.Errorf("fuse-loopback (pid %d) still running 10 s after the unmount of %s; killed", l.cmd.Process.Pid, l.mnt))
	}
	return err
}

// serveLoopback is the child: it mounts tree at mnt and serves it until
// it is unmounted.
func serveLoopback(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtool "+serveLoopbackFlag+" TREE MOUNTPOINT")
		return 2
	}
	root, err := fs.NewLoopbackRoot(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fuse-loopback:", err)
		return 1
	}
	timeout := 30 * time.Second // sbxfs's (fuse.DefaultTimeout)
	srv, err := fs.Mount(args[1], root, &fs.Options{
		EntryTimeout: &timeout, AttrTimeout: &timeout, NegativeTimeout: &timeout,
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			FsName: "fuse-loopback", Name: "loopback",
			Options:       []string{"default_permissions", "nosuid", "nodev"},
			DirectMount:   true,
			MaxBackground: 64,
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fuse-loopback:", err)
		return 1
	}
	srv.Wait()
	return 0
}
