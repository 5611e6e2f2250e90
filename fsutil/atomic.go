package fsutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// tempBaseMax bounds the part of the target's name copied into a temp name,
// so the temp name stays below NAME_MAX (255) for any target name.
const tempBaseMax = 64

// WriteFileAtomic replaces path with a file holding data, so that after a
// crash path holds either its old content or data, never a mix. It writes a
// temp file with an unpredictable name in the same directory (O_EXCL,
// O_NOFOLLOW), fsyncs it, renames it over path and fsyncs the directory. The
// temp file is removed on every error path. perm is subject to the umask, as
// with os.WriteFile. A symlink at path is replaced, not followed.
//
// An error after the rename (the directory fsync) means path already holds
// data but its durability is not assured.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if len(base) > tempBaseMax {
		base = base[:tempBaseMax]
	}
	tmp := filepath.Join(dir, TempName("."+base+".tmp-"))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return fmt.Errorf("write %q atomically: %w", path, err)
	}
	if err := writeSyncClose(f, data); err != nil {
		return errors.Join(fmt.Errorf("write %q atomically: %w", path, err), removeTemp(tmp))
	}
	// unix.Rename, not os.Rename: the latter stats path first and answers
	// EEXIST for a directory; the kernel's errno is more precise.
	if err := unix.Rename(tmp, path); err != nil {
		return errors.Join(fmt.Errorf("write %q atomically: rename: %w", path, err), removeTemp(tmp))
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("write %q atomically: %w", path, err)
	}
	return nil
}

// writeSyncClose writes data to f, fsyncs and closes it; f is closed on
// every path.
func writeSyncClose(f *os.File, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeTemp removes a temp file left by a failed atomic write; an already
// missing file is fine.
func removeTemp(tmp string) error {
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove temp file: %w", err)
	}
	return nil
}

// SyncDir fsyncs the directory dir, making the creation, removal and renames
// of its entries durable.
func SyncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync dir %q: open: %w", dir, err)
	}
	err = unix.Fsync(fd)
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		return fmt.Errorf("sync dir %q: close: %w", dir, cerr)
	}
	if err != nil {
		return fmt.Errorf("sync dir %q: fsync: %w", dir, err)
	}
	return nil
}

// TempName returns prefix followed by 16 random hex characters from
// crypto/rand, a name another process cannot guess in advance.
func TempName(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (it crashes the program instead)
	return prefix + hex.EncodeToString(b[:])
}
