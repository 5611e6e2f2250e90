package fsutil

import (
	"errors"
	"fmt"
	"io"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// cfrChunk bounds one copy_file_range call, so a huge extent is copied in
	// steps and a shrinking source is noticed early.
	cfrChunk = 1 << 30
	// bufSize is the buffer of the pread/pwrite fallback.
	bufSize = 1 << 20
	// smallFile is the largest file copied as one range: the clone
	// attempt and the extent walk would cost more system calls than
	// they save (a copy-up of a small file takes about twenty).
	smallFile = 64 << 10
)

// CopyData copies the whole content of the regular file open as src into dst,
// which must be a freshly created, empty regular file opened for writing
// without O_APPEND (pwrite ignores the offset on an O_APPEND fd).
//
// A file of at most 64 KiB is copied as one range with copy_file_range
// (a hole in it, which such a file rarely has, becomes zeros in dst).
// A larger one is first tried with FICLONE, which shares the extents on
// filesystems that can (btrfs, xfs with reflink). Otherwise CopyData walks
// the data extents of src with SEEK_DATA/SEEK_HOLE and copies each one with
// copy_file_range, falling back to pread/pwrite when the kernel or the
// filesystem pair cannot; holes are left as holes. dst is finally truncated
// to the size of src so a trailing hole keeps the right size. If src shrinks
// during the copy, dst ends where src ended.
//
// src must be a regular file: CopyData refuses anything else with EINVAL
// before reading, so it never blocks on a FIFO. The file offset of src is
// moved (SEEK_DATA/SEEK_HOLE); the offset of dst is not. CopyData does not
// fsync dst; the caller decides when content must be durable.
func CopyData(dst, src int) error {
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return fmt.Errorf("copy data: fstat source: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("copy data: source mode %#o is not a regular file: %w", st.Mode, unix.EINVAL)
	}
	if st.Size <= smallFile {
		// dst ends where the copy ended: at st.Size, or where src
		// ended if it shrank.
		_, err := (&copier{dst: dst, src: src}).copyRange(0, st.Size)
		return err
	}
	// Any FICLONE failure (EXDEV, EOPNOTSUPP, EINVAL, ENOTTY, EBADF...) means
	// "cannot share extents here"; a real problem shows again below.
	if err := unix.IoctlFileClone(dst, src); err == nil {
		return nil
	}
	return copySparse(&copier{dst: dst, src: src}, st.Size)
}

// copySparse copies the data extents of c.src below size, then sets the size
// of c.dst: size, or the size of c.src now if it shrank meanwhile.
func copySparse(c *copier, size int64) error {
	size, err := c.copyExtents(size)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(c.src, &st); err != nil {
		return fmt.Errorf("copy data: fstat source: %w", err)
	}
	size = min(size, st.Size)
	if err := unix.Ftruncate(c.dst, size); err != nil {
		return fmt.Errorf("copy data: truncate destination to %d: %w", size, err)
	}
	return nil
}

// copier copies byte ranges at equal offsets from src to dst.
type copier struct {
	dst, src int
	noCFR    bool   // copy_file_range failed with a fallback errno once
	buf      []byte // pread/pwrite buffer, allocated on first use
}

// copyExtents copies every data extent of src below size and returns the size
// dst must have: size, or less if src shrank meanwhile.
func (c *copier) copyExtents(size int64) (int64, error) {
	off := int64(0)
	for off < size {
		start, err := retryEINTR(func() (int64, error) { return unix.Seek(c.src, off, unix.SEEK_DATA) })
		switch {
		case errors.Is(err, unix.ENXIO):
			return size, nil // only a hole (or EOF) after off
		case errors.Is(err, unix.EINVAL):
			// No SEEK_DATA here: the rest of the file is one extent.
			return c.copyRange(off, size)
		case err != nil:
			return 0, fmt.Errorf("copy data: seek data from %d: %w", off, err)
		}
		if start >= size {
			return size, nil
		}
		end, err := retryEINTR(func() (int64, error) { return unix.Seek(c.src, start, unix.SEEK_HOLE) })
		if errors.Is(err, unix.ENXIO) {
			return start, nil // src shrank below start
		}
		if err != nil {
			return 0, fmt.Errorf("copy data: seek hole from %d: %w", start, err)
		}
		end = min(end, size)
		reached, err := c.copyRange(start, end)
		if err != nil || reached < end {
			return reached, err
		}
		off = end
	}
	return size, nil
}

// copyRange copies [off, end) and returns the offset reached: end, or less if
// src hit EOF first (it shrank).
func (c *copier) copyRange(off, end int64) (int64, error) {
	for off < end {
		if !c.noCFR {
			roff, woff := off, off
			n, err := unix.CopyFileRange(c.src, &roff, c.dst, &woff, int(min(end-off, cfrChunk)), 0)
			switch {
			case err == nil && n == 0:
				// EOF, or a filesystem whose copy_file_range copies
				// nothing (seen across filesystems on some kernels):
				// pread below tells which.
				c.noCFR = true
			case err == nil:
				off += int64(n)
				continue
			case errors.Is(err, unix.EINTR):
				continue
			case isCFRFallback(err):
				c.noCFR = true
			default:
				return off, fmt.Errorf("copy data: copy_file_range at %d: %w", off, err)
			}
		}
		n, err := c.preadPwrite(off, end)
		if err != nil || n == 0 {
			return off, err
		}
		off += n
	}
	return off, nil
}

// preadPwrite copies at most one buffer from off; 0 means EOF on src.
func (c *copier) preadPwrite(off, end int64) (int64, error) {
	if c.buf == nil {
		c.buf = make([]byte, bufSize)
	}
	buf := c.buf[:min(end-off, int64(len(c.buf)))]
	n, err := retryEINTR(func() (int, error) { return unix.Pread(c.src, buf, off) })
	if err != nil {
		return 0, fmt.Errorf("copy data: read at %d: %w", off, err)
	}
	for done := 0; done < n; {
		w, err := retryEINTR(func() (int, error) { return unix.Pwrite(c.dst, buf[done:n], off+int64(done)) })
		if err != nil {
			return 0, fmt.Errorf("copy data: write at %d: %w", off+int64(done), err)
		}
		if w == 0 {
			return 0, fmt.Errorf("copy data: write at %d: %w", off+int64(done), io.ErrShortWrite)
		}
		done += w
	}
	return int64(n), nil
}

// isCFRFallback reports whether a copy_file_range error means "use
// pread/pwrite instead" rather than a real I/O failure.
func isCFRFallback(err error) bool {
	return errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) ||
		errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)
}

// retryEINTR calls f until it does not fail with EINTR.
func retryEINTR[T any](f func() (T, error)) (T, error) {
	for {
		v, err := f()
		if !errors.Is(err, unix.EINTR) {
			return v, err
		}
	}
}

// CopyTimes sets the access and modification times of dstFd to those in st,
// with nanosecond precision (futimens). dstFd must not be an O_PATH fd. Set
// the times after writing the content: a write updates the mtime.
func CopyTimes(dstFd int, st *unix.Stat_t) error {
	ts := [2]unix.Timespec{st.Atim, st.Mtim}
	// futimens(fd, ts) is utimensat(fd, NULL, ts, 0); x/sys has no wrapper
	// taking a NULL path.
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(dstFd), 0,
		uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("copy times: futimens: %w", errno)
	}
	return nil
}

// IsWhiteout reports whether st describes a kernel overlayfs whiteout: a
// character device with device number 0/0.
func IsWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}
