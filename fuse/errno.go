package fuse

import (
	"errors"
	"log/slog"
	"syscall"

	"github.com/sbxfs/sbxfs/layers"
)

// toErrno maps an error from layers or a syscall to the errno the kernel
// gets. It is the one place that does so: wrapped errors are unwrapped to
// their syscall.Errno; sentinel errors of our own get a fitting errno;
// anything else is logged and becomes EIO. (go-fuse's ToErrno does not
// unwrap %w errors, so it is not used here.)
func (fs *filesystem) toErrno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	switch {
	case errors.Is(err, layers.ErrReservedName):
		return syscall.EPERM
	}
	fs.log.Error("unexpected error", slog.String("op", op), slog.Any("err", err))
	return syscall.EIO
}
