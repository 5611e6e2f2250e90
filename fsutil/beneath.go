package fsutil

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// openat2Retries bounds the retries of openat2 on EAGAIN (a concurrent rename
// anywhere in the system may make RESOLVE_BENEATH ask for one).
const openat2Retries = 16

// OpenBeneath opens rel beneath the directory fd rootFd. It never follows a
// symlink, in any component, and never resolves outside the root: a symlink
// gives ELOOP, except that a symlink as the last component with O_PATH and
// O_NOFOLLOW in flags opens the symlink itself. rel goes through CleanRel
// first ("" opens the root itself, ".." is refused with ErrPathEscapes); a
// trailing slash is dropped, so it does not require a directory (use
// O_DIRECTORY for that). O_CLOEXEC is always added; mode is used only with
// O_CREAT or O_TMPFILE.
//
// It uses openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS, and on kernels without openat2 (ENOSYS, before 5.6)
// a walk opening one component at a time with O_NOFOLLOW.
func OpenBeneath(rootFd int, rel string, flags int, mode uint32) (int, error) {
	clean, err := CleanRel(rel)
	if err != nil {
		return -1, fmt.Errorf("open beneath: %w", err)
	}
	fd, err := openat2Beneath(rootFd, clean, flags, mode)
	if errors.Is(err, unix.ENOSYS) {
		fd, err = openWalk(rootFd, clean, flags, mode)
	}
	if err != nil {
		return -1, fmt.Errorf("open %q beneath root: %w", clean, err)
	}
	return fd, nil
}

// OpenBeneathRaw is OpenBeneath for hot paths: the error is the bare
// errno (ENOENT, ENOTDIR, ELOOP for a symlink on the way...), not wrapped.
// rel must be relative; it is cleaned only on kernels without openat2,
// where the walk could otherwise step out through "..".
func OpenBeneathRaw(rootFd int, rel string, flags int) (int, error) {
	fd, err := openat2Beneath(rootFd, rel, flags, 0)
	if errors.Is(err, unix.ENOSYS) {
		clean, cerr := CleanRel(rel)
		if cerr != nil {
			return -1, unix.EXDEV
		}
		fd, err = openWalk(rootFd, clean, flags, 0)
	}
	return fd, err
}

// OpenDirBeneath opens, as an O_PATH|O_DIRECTORY fd, the directory that holds
// the last component of rel, resolved like OpenBeneath. Use it with the *at
// syscalls on path.Base of the CleanRel form of rel. The root has no parent
// beneath itself: rel "" gives EINVAL.
func OpenDirBeneath(rootFd int, rel string) (int, error) {
	clean, err := CleanRel(rel)
	if err != nil {
		return -1, fmt.Errorf("open parent beneath: %w", err)
	}
	if clean == "" {
		return -1, fmt.Errorf("open parent beneath: the root has no parent: %w", unix.EINVAL)
	}
	fd, err := OpenBeneath(rootFd, path.Dir(clean), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, fmt.Errorf("open parent of %q: %w", clean, err)
	}
	return fd, nil
}

// openat2Beneath opens the clean relative path rel with openat2. A path
// too long for one system call (PATH_MAX, its NUL included) is opened a
// piece at a time: each piece's directory beneath the one before, so the
// whole stays beneath rootFd and follows no symlink. ext4 and kernel
// overlayfs hold trees deeper than PATH_MAX; before 2026-11-28 sbxfs
// answered ENAMETOOLONG for every object of an original below that depth
// (TestDeepPaths).
func openat2Beneath(rootFd int, rel string, flags int, mode uint32) (int, error) {
	if len(rel) >= unix.PathMax {
		return openLong(rootFd, rel, flags, mode)
	}
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	// openat2 refuses a mode without O_CREAT or O_TMPFILE; O_TMPFILE
	// includes the O_DIRECTORY bit, so test all of its bits.
	if flags&unix.O_CREAT != 0 || flags&unix.O_TMPFILE == unix.O_TMPFILE {
		how.Mode = uint64(mode)
	}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(rootFd, rel, &how)
		if err == nil {
			return fd, nil
		}
		retry := errors.Is(err, unix.EINTR) || (errors.Is(err, unix.EAGAIN) && i < openat2Retries)
		if !retry {
			return -1, err
		}
	}
}

// openLong opens rel, at least PATH_MAX long, as openat2Beneath: the
// longest leading piece that fits, as a directory, then the rest beneath it.
func openLong(rootFd int, rel string, flags int, mode uint32) (int, error) {
	dir := rootFd
	defer func() {
		if dir != rootFd {
			unix.Close(dir)
		}
	}()
	for len(rel) >= unix.PathMax {
		i := strings.LastIndexByte(rel[:unix.PathMax], '/')
		if i <= 0 {
			return -1, unix.ENAMETOOLONG // a name longer than any filesystem takes
		}
		fd, err := openat2Beneath(dir, rel[:i], unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return -1, err
		}
		if dir != rootFd {
			unix.Close(dir)
		}
		dir, rel = fd, rel[i+1:]
	}
	return openat2Beneath(dir, rel, flags, mode)
}

// openWalk opens the clean relative path rel one component at a time, for
// kernels without openat2. Each directory is opened O_PATH|O_NOFOLLOW|
// O_DIRECTORY and the last component O_NOFOLLOW; rel has no "..", so the
// walk cannot leave the root.
func openWalk(rootFd int, rel string, flags int, mode uint32) (int, error) {
	if rel == "" {
		return openatNoFollow(rootFd, ".", flags, mode)
	}
	dir := rootFd
	defer func() {
		if dir != rootFd {
			unix.Close(dir)
		}
	}()
	parent, last := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		parent, last = rel[:i], rel[i+1:]
	}
	for rest := parent; rest != ""; {
		var c string
		c, rest, _ = strings.Cut(rest, "/")
		fd, err := openatNoFollow(dir, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return -1, err
		}
		if dir != rootFd {
			unix.Close(dir)
		}
		dir = fd
	}
	return openatNoFollow(dir, last, flags, mode)
}

// openatNoFollow is openat with O_NOFOLLOW|O_CLOEXEC. A symlink opened with
// O_DIRECTORY gives ENOTDIR; it is reported as ELOOP, as openat2 does.
func openatNoFollow(dir int, name string, flags int, mode uint32) (int, error) {
	fd, err := retryEINTR(func() (int, error) {
		return unix.Openat(dir, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	})
	if errors.Is(err, unix.ENOTDIR) && flags&unix.O_DIRECTORY != 0 {
		var st unix.Stat_t
		if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return -1, unix.ELOOP
		}
	}
	if err != nil {
		return -1, err
	}
	return fd, nil
}
