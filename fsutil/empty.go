package fsutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// EmptyDir removes every entry of dir, keeping dir itself. It follows no
// symlink: a symlink in dir is removed, not what it points to.
func EmptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// RemoveContentsAt removes everything in the directory dir (a
// descriptor, O_PATH will do) through descriptors: what it removes is
// what is in that directory wherever it has been moved, never what a
// path leads to now, and no symlink in it is followed.
func RemoveContentsAt(dir int) error {
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), ".")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		err := unix.Unlinkat(fd, n, 0)
		if errors.Is(err, unix.EISDIR) {
			var sub int
			if sub, err = unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
				err = RemoveContentsAt(sub)
				unix.Close(sub)
				if err == nil {
					err = unix.Unlinkat(fd, n, unix.AT_REMOVEDIR)
				}
			}
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove %s: %w", n, err)
		}
	}
	return nil
}
