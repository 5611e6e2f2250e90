package fuse

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// go-fuse does not export a Server's /dev/fuse descriptor, which the
// transports of this package read themselves (devloop.go, uring_*.go).
// These helpers reach it with reflection; TestIOUringServes and every
// mount through /dev/fuse fail if a go-fuse upgrade moves it.

// fuseDevFd returns a duplicate of the /dev/fuse descriptor of srv.
func fuseDevFd(srv *gofuse.Server) (int, error) {
	conn, err := goFuseField[syscall.RawConn](srv, "conn")
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := (*conn).Control(func(raw uintptr) {
		fd, derr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("dup /dev/fuse: %w", derr)
	}
	return fd, nil
}

// goFuseField returns a pointer to the field name of srv's fuseFD, which
// must be of type T.
func goFuseField[T any](srv *gofuse.Server, name string) (*T, error) {
	v := reflect.ValueOf(srv).Elem().FieldByName("fuseFD")
	if !v.IsValid() || v.Kind() != reflect.Pointer || v.IsNil() {
		return nil, errors.New("go-fuse's Server has no fuseFD field")
	}
	f := v.Elem().FieldByName(name)
	if !f.IsValid() || f.Type() != reflect.TypeFor[T]() {
		return nil, fmt.Errorf("go-fuse's fuseFD has no %s field of type %v", name, reflect.TypeFor[T]())
	}
	return (*T)(unsafe.Pointer(f.UnsafeAddr())), nil
}

// goFuseLoopOver tells go-fuse that srv's serving loop, which NewServer
// counts on and which never runs when devLoop serves the mount, is over:
// Server.Unmount waits for it after unmounting. It returns go-fuse's
// /dev/fuse file, for the caller to close once the mount is gone.
func goFuseLoopOver(srv *gofuse.Server) (*os.File, error) {
	loops, err := goFuseField[sync.WaitGroup](srv, "loops")
	if err != nil {
		return nil, err
	}
	file, err := goFuseField[*os.File](srv, "file")
	if err != nil {
		return nil, err
	}
	loops.Done()
	return *file, nil
}
