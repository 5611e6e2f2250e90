package tests

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// The operations of the differential tests: each picks its arguments
// from the plain directory and does the same thing under either root.

type weightedOp struct {
	w    int
	make func(r *diffRun) diffOp
}

var diffOps = []weightedOp{
	{10, opCreate}, {10, opWriteAt}, {6, opAppend}, {5, opTruncate}, {2, opFtruncate},
	{4, opRead}, {6, opMkdir}, {5, opRmdir}, {6, opUnlink}, {14, opRename},
	{4, opSymlink}, {4, opLink}, {5, opChmod}, {5, opUtimes}, {2, opMkfifo},
	{5, opSetxattr}, {3, opRemovexattr}, {2, opListdir}, {2, opOpenExcl},
	{4, opFdOpen}, {3, opFdWrite}, {3, opFdRead}, {2, opFdStat}, {1, opFdTruncate},
	{1, opFdChmod}, {1, opFdSync}, {1, opFdClose},
}

// diffMaxEntries bounds the tree: past it, every other operation deletes
// something, so that each comparison stays cheap.
const diffMaxEntries = 150

func (r *diffRun) nextOp() diffOp {
	if len(r.ents) > diffMaxEntries && r.rng.Intn(2) == 0 {
		if r.rng.Intn(3) == 0 {
			return opRmdir(r)
		}
		return opUnlink(r)
	}
	total := 0
	for _, o := range r.ops {
		total += o.w
	}
	n := r.rng.Intn(total)
	for _, o := range r.ops {
		if n < o.w {
			if avoiding("fds") && isFdOp(o) {
				return r.nextOp()
			}
			return o.make(r)
		}
		n -= o.w
	}
	panic("unreachable")
}

// fdOps are the operations on descriptors the run keeps open.
var fdOps = []func(r *diffRun) diffOp{opFdOpen, opFdWrite, opFdRead, opFdStat, opFdTruncate, opFdChmod, opFdSync, opFdClose,
	opFdChown, opFdFallocate, opFdCopyRange, opFdMmapWrite}

func isFdOp(o weightedOp) bool {
	p := reflect.ValueOf(o.make).Pointer()
	return slices.ContainsFunc(fdOps, func(f func(r *diffRun) diffOp) bool { return reflect.ValueOf(f).Pointer() == p })
}

var fileModes = []uint32{0o644, 0o600, 0o755, 0o444, 0o640, 0o4755, 0o2755, 0o1777, 0o000}

func openFlagsName(f int) string {
	var s []string
	for _, x := range []struct {
		f int
		n string
	}{{unix.O_CREAT, "O_CREAT"}, {unix.O_EXCL, "O_EXCL"}, {unix.O_TRUNC, "O_TRUNC"}, {unix.O_APPEND, "O_APPEND"}, {unix.O_NOFOLLOW, "O_NOFOLLOW"}} {
		if f&x.f != 0 {
			s = append(s, x.n)
		}
	}
	switch f & unix.O_ACCMODE {
	case unix.O_RDONLY:
		s = append([]string{"O_RDONLY"}, s...)
	case unix.O_WRONLY:
		s = append([]string{"O_WRONLY"}, s...)
	default:
		s = append([]string{"O_RDWR"}, s...)
	}
	return strings.Join(s, "|")
}

// writeOp opens rel with flags and writes data at off (off < 0: a plain
// write, for O_APPEND); it returns the byte count.
func writeOp(desc, rel string, flags int, mode uint32, data []byte, off int64) diffOp {
	return diffOp{
		desc: desc,
		do: func(root string) (any, error) {
			fd, err := unix.Open(filepath.Join(root, rel), flags|unix.O_CLOEXEC|unix.O_NONBLOCK, mode)
			if err != nil {
				return nil, err
			}
			var n int
			if off < 0 {
				n, err = unix.Write(fd, data)
			} else {
				n, err = unix.Pwrite(fd, data, off)
			}
			if cerr := unix.Close(fd); err == nil {
				err = cerr
			}
			return n, err
		},
		check: equalResults,
		parts: []string{rel},
	}
}

func equalResults(a, b any) string {
	if fmt.Sprint(a) != fmt.Sprint(b) {
		return fmt.Sprintf("plain dir %v, sbxfs %v", a, b)
	}
	return ""
}

func opCreate(r *diffRun) diffOp {
	rel := r.newPath()
	if r.rng.Intn(3) == 0 {
		rel = r.existing(anyEnt)
	}
	flags, mode, data := r.createArgs()
	return writeOp(fmt.Sprintf("create %q %s mode %#o, write %d bytes", rel, openFlagsName(flags), mode, len(data)), rel, flags, mode, data, 0)
}

// createArgs picks the flags, mode and content of a file creation.
func (r *diffRun) createArgs() (flags int, mode uint32, data []byte) {
	flags = unix.O_CREAT | unix.O_WRONLY
	if r.rng.Intn(3) == 0 {
		flags |= unix.O_EXCL
	}
	if r.rng.Intn(3) == 0 {
		flags |= unix.O_TRUNC
	}
	return flags, r.pickMode(fileModes), randBytes(r.rng, r.rng.Intn(3000))
}

func opWriteAt(r *diffRun) diffOp {
	rel := r.existing(isFileEnt)
	off := r.rng.Int63n(r.fileSize(rel) + 2000)
	if r.rng.Intn(20) == 0 {
		off = 1<<20 + r.rng.Int63n(1<<20) // a hole
	}
	flags := unix.O_WRONLY
	if r.rng.Intn(2) == 0 {
		flags = unix.O_RDWR
	}
	if r.rng.Intn(4) == 0 {
		flags |= unix.O_NOFOLLOW
	}
	data := randBytes(r.rng, 1+r.rng.Intn(4000))
	return writeOp(fmt.Sprintf("pwrite %q %s %d bytes at %d", rel, openFlagsName(flags), len(data), off), rel, flags, 0, data, off)
}

func opAppend(r *diffRun) diffOp {
	rel := r.existing(isFileEnt)
	data := randBytes(r.rng, 1+r.rng.Intn(2000))
	flags := unix.O_WRONLY | unix.O_APPEND
	return writeOp(fmt.Sprintf("append %d bytes to %q", len(data), rel), rel, flags, 0, data, -1)
}

func opTruncate(r *diffRun) diffOp {
	rel := r.existing(isFileEnt)
	size := r.rng.Int63n(r.fileSize(rel) + 3000)
	if r.rng.Intn(4) == 0 {
		size = 0
	}
	return diffOp{desc: fmt.Sprintf("truncate %q to %d", rel, size), do: func(root string) (any, error) {
		return nil, unix.Truncate(filepath.Join(root, rel), size)
	}, parts: []string{rel}}
}

func opFtruncate(r *diffRun) diffOp {
	rel := r.existing(isFileEnt)
	size := r.rng.Int63n(r.fileSize(rel) + 3000)
	return diffOp{desc: fmt.Sprintf("ftruncate %q to %d", rel, size), do: func(root string) (any, error) {
		fd, err := unix.Open(filepath.Join(root, rel), unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return nil, err
		}
		defer unix.Close(fd)
		return nil, unix.Ftruncate(fd, size)
	}, parts: []string{rel}}
}

func opRead(r *diffRun) diffOp {
	rel := r.existing(isFileEnt)
	return diffOp{desc: fmt.Sprintf("read %q", rel), do: func(root string) (any, error) {
		fd, err := unix.Open(filepath.Join(root, rel), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return nil, err
		}
		defer unix.Close(fd)
		var out bytes.Buffer
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				return out.Bytes(), nil
			}
			out.Write(buf[:n])
		}
	}, check: func(a, b any) string {
		x, y := a.([]byte), b.([]byte)
		if !bytes.Equal(x, y) {
			return fmt.Sprintf("content: plain dir %d bytes, sbxfs %d bytes (first difference at %d)", len(x), len(y), firstDiff(x, y))
		}
		return ""
	}, keepsTree: true}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func opMkdir(r *diffRun) diffOp {
	rel := r.newPath()
	mode := r.pickMode([]uint32{0o755, 0o700, 0o2775, 0o1777, 0o555, 0o000})
	return diffOp{desc: fmt.Sprintf("mkdir %q %#o", rel, mode), do: func(root string) (any, error) {
		return nil, unix.Mkdir(filepath.Join(root, rel), mode)
	}}
}

func opRmdir(r *diffRun) diffOp {
	rel := r.existing(isDirEnt)
	if r.rng.Intn(6) == 0 {
		rel = r.existing(anyEnt)
	}
	return diffOp{desc: fmt.Sprintf("rmdir %q", rel), do: func(root string) (any, error) {
		return nil, unix.Rmdir(filepath.Join(root, rel))
	}}
}

func opUnlink(r *diffRun) diffOp {
	rel := r.existing(func(e diffEnt) bool { return !isDirEnt(e) })
	if r.rng.Intn(8) == 0 {
		rel = r.existing(isDirEnt)
	}
	if p, ok := r.openPath(); ok {
		rel = p
	}
	return diffOp{desc: fmt.Sprintf("unlink %q", rel), do: func(root string) (any, error) {
		return nil, unix.Unlink(filepath.Join(root, rel))
	}, drops: []string{rel}}
}

func opRename(r *diffRun) diffOp {
	var src string
	if r.rng.Intn(2) == 0 {
		src = r.existing(isDirEnt)
	} else {
		src = r.existing(anyEnt)
	}
	if p, ok := r.openPath(); ok {
		src = p
	}
	var dst string
	switch r.rng.Intn(4) {
	case 0:
		dst = r.existing(anyEnt) // over whatever is there
	case 1:
		dst = r.existing(isDirEnt) // over a directory, maybe empty
	default:
		dst = r.newPath()
	}
	if avoiding("dirtonew") && r.isDir(src) && !r.exists(dst) {
		dst = r.existing(anyEnt)
	}
	var flags uint
	name := "rename"
	switch r.rng.Intn(7) {
	case 0:
		flags, name = unix.RENAME_NOREPLACE, "rename NOREPLACE"
	case 1:
		flags, name = unix.RENAME_EXCHANGE, "rename EXCHANGE"
	}
	return renameOp(fmt.Sprintf("%s %q -> %q", name, src, dst), src, dst, flags)
}

// renameOp renames src to dst (paths from the root) with renameat2's
// flags.
func renameOp(desc, src, dst string, flags uint) diffOp {
	op := diffOp{desc: desc, do: func(root string) (any, error) {
		return nil, unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, src), unix.AT_FDCWD, filepath.Join(root, dst), flags)
	}, nofollow: true}
	switch {
	case src == dst: // nothing moves
	case flags == unix.RENAME_EXCHANGE:
		op.parts = []string{src, dst}
	default:
		op.parts, op.drops = []string{src}, []string{dst}
	}
	return op
}

func opSymlink(r *diffRun) diffOp {
	rel := r.newPath()
	// Targets are names in the link's own directory (or nowhere): a link
	// never leads out of the tree, whatever the plain dir's ops follow.
	target := []string{"f01", "n0", "x", "missing", "b", "ln"}[r.rng.Intn(6)]
	return diffOp{desc: fmt.Sprintf("symlink %q -> %q", rel, target), do: func(root string) (any, error) {
		return nil, unix.Symlink(target, filepath.Join(root, rel))
	}}
}

func opLink(r *diffRun) diffOp {
	src := r.existing(func(e diffEnt) bool { return !isDirEnt(e) })
	if r.rng.Intn(10) == 0 {
		src = r.existing(isDirEnt)
	}
	dst := r.newPath()
	return diffOp{desc: fmt.Sprintf("link %q -> new name %q", src, dst), do: func(root string) (any, error) {
		return nil, unix.Link(filepath.Join(root, src), filepath.Join(root, dst))
	}, parts: []string{src}, nofollow: true}
}

func opChmod(r *diffRun) diffOp {
	rel := r.existing(anyEnt)
	if r.rng.Intn(15) == 0 {
		rel = "" // the root
	}
	mode := r.pickMode(fileModes)
	if rel == "" {
		mode = []uint32{0o755, 0o700, 0o775}[r.rng.Intn(3)]
	}
	return diffOp{desc: fmt.Sprintf("chmod %q %#o", rel, mode), do: func(root string) (any, error) {
		return nil, unix.Chmod(filepath.Join(root, rel), mode)
	}, keepsTree: true, parts: []string{rel}}
}

type timesResult struct{ before, after unix.Stat_t }

func opUtimes(r *diffRun) diffOp {
	rel := r.existing(anyEnt)
	pickTime := func() unix.Timespec {
		switch r.rng.Intn(5) {
		case 0:
			return unix.Timespec{Nsec: unix.UTIME_OMIT}
		case 1:
			return unix.Timespec{Nsec: unix.UTIME_NOW}
		}
		return unix.Timespec{Sec: 1_500_000_000 + r.rng.Int63n(200_000_000), Nsec: r.rng.Int63n(1_000_000_000)}
	}
	ts := []unix.Timespec{pickTime(), pickTime()}
	flags := 0
	if r.rng.Intn(3) == 0 {
		flags = unix.AT_SYMLINK_NOFOLLOW
	}
	tname := func(x unix.Timespec) string {
		switch x.Nsec {
		case unix.UTIME_OMIT:
			return "OMIT"
		case unix.UTIME_NOW:
			return "NOW"
		}
		return fmt.Sprintf("%d.%09d", x.Sec, x.Nsec)
	}
	desc := fmt.Sprintf("utimensat %q atime=%s mtime=%s nofollow=%v", rel, tname(ts[0]), tname(ts[1]), flags != 0)
	var parts []string
	if ts[0].Nsec != unix.UTIME_OMIT || ts[1].Nsec != unix.UTIME_OMIT {
		parts = []string{rel} // else it changes the ctime alone: no copy-up
	}
	stat := func(p string, st *unix.Stat_t) error {
		if flags != 0 {
			return unix.Lstat(p, st)
		}
		return unix.Stat(p, st)
	}
	return diffOp{desc: desc, do: func(root string) (any, error) {
		p := filepath.Join(root, rel)
		var res timesResult
		_ = stat(p, &res.before)
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, flags); err != nil {
			return nil, err
		}
		return res, stat(p, &res.after)
	}, check: func(a, b any) string {
		ra, rb := a.(timesResult), b.(timesResult)
		var d []string
		for i, name := range []string{"atime", "mtime"} {
			ga := []unix.Timespec{ra.after.Atim, ra.after.Mtim}[i]
			gb := []unix.Timespec{rb.after.Atim, rb.after.Mtim}[i]
			switch ts[i].Nsec {
			case unix.UTIME_OMIT:
				dir := rb.after.Mode&unix.S_IFMT == unix.S_IFDIR
				if was := []unix.Timespec{rb.before.Atim, rb.before.Mtim}[i]; gb != was && name == "mtime" && !(dir && avoiding("dirmtime")) {
					d = append(d, fmt.Sprintf("sbxfs changed the omitted %s from %v to %v", name, was, gb))
				}
			case unix.UTIME_NOW:
			default:
				if ga != gb || gb != ts[i] {
					d = append(d, fmt.Sprintf("%s: plain dir %v, sbxfs %v, asked %v", name, ga, gb, ts[i]))
				}
			}
		}
		return strings.Join(d, "; ")
	}, keepsTree: true, parts: parts, nofollow: flags != 0}
}

func opMkfifo(r *diffRun) diffOp {
	rel := r.newPath()
	return diffOp{desc: fmt.Sprintf("mkfifo %q", rel), do: func(root string) (any, error) {
		return nil, unix.Mkfifo(filepath.Join(root, rel), 0o644)
	}}
}

var xattrNames = []string{"user.a", "user.b", "user.c"}

func opSetxattr(r *diffRun) diffOp {
	rel := r.existing(anyEnt)
	if r.rng.Intn(15) == 0 {
		rel = ""
	}
	name := xattrNames[r.rng.Intn(len(xattrNames))]
	val := randBytes(r.rng, r.rng.Intn(200))
	flags := []int{0, 0, unix.XATTR_CREATE, unix.XATTR_REPLACE}[r.rng.Intn(4)]
	nofollow := r.rng.Intn(3) == 0
	if avoiding("xattrflags") {
		flags = 0
	}
	return diffOp{desc: fmt.Sprintf("setxattr %q %s (%d bytes) flags %d nofollow=%v", rel, name, len(val), flags, nofollow),
		do: func(root string) (any, error) {
			p := filepath.Join(root, rel)
			if nofollow {
				return nil, unix.Lsetxattr(p, name, val, flags)
			}
			return nil, unix.Setxattr(p, name, val, flags)
		}, keepsTree: true, parts: []string{rel}, nofollow: nofollow}
}

func opRemovexattr(r *diffRun) diffOp {
	rel := r.existing(anyEnt)
	name := xattrNames[r.rng.Intn(len(xattrNames))]
	return diffOp{desc: fmt.Sprintf("removexattr %q %s", rel, name), do: func(root string) (any, error) {
		return nil, unix.Removexattr(filepath.Join(root, rel), name)
	}, keepsTree: true, parts: []string{rel}}
}

func opListdir(r *diffRun) diffOp {
	rel := r.dir()
	return diffOp{desc: fmt.Sprintf("readdir %q", rel), do: func(root string) (any, error) {
		f, err := os.Open(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		names, err := f.Readdirnames(-1)
		slices.Sort(names)
		return strings.Join(names, ","), err
	}, check: equalResults, keepsTree: true}
}

func opOpenExcl(r *diffRun) diffOp {
	rel := r.existing(anyEnt)
	return diffOp{desc: fmt.Sprintf("open %q O_CREAT|O_EXCL", rel), do: func(root string) (any, error) {
		fd, err := unix.Open(filepath.Join(root, rel), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
		if err == nil {
			err = unix.Close(fd)
		}
		return nil, err
	}}
}

func appendFile(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// --- operations on descriptors kept open ---

func (r *diffRun) slot() int { return r.rng.Intn(diffSlots) }

func opFdOpen(r *diffRun) diffOp {
	k := r.slot()
	rel := r.existing(isFileEnt)
	flags := []int{unix.O_RDONLY, unix.O_RDONLY, unix.O_RDWR, unix.O_WRONLY | unix.O_APPEND, unix.O_RDWR | unix.O_CREAT}[r.rng.Intn(5)]
	if _, linked := r.links.unparted(rel); linked && flags == unix.O_RDONLY {
		// A descriptor open read-only on such a name follows its copy-up
		// in the sandbox; the plain directory's would stay with the
		// shared file (linkModel). Open it for writing: that copies up.
		flags = unix.O_RDWR
	}
	var parts []string
	if st, err := os.Stat(filepath.Join(r.ref, rel)); flags != unix.O_RDONLY && (err != nil || st.Mode().IsRegular()) {
		// Opened for writing, a file is copied up. A FIFO, socket or
		// device is not: the kernel opens it itself, as in kernel
		// overlayfs (a FIFO with several links keeps them; seed
		// 699407309 of TestDifferentialStacked).
		parts = []string{rel}
	}
	return diffOp{desc: fmt.Sprintf("fd%d = open %q %s", k, rel, openFlagsName(flags)), keepsTree: flags&unix.O_CREAT == 0, parts: parts,
		onSide: func(side int, root string) (any, error) {
			if fd := r.fds[side][k]; fd >= 0 {
				unix.Close(fd)
				r.fds[side][k] = -1
			}
			fd, err := unix.Open(filepath.Join(root, rel), flags|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
			if err == nil {
				r.fds[side][k] = fd
				r.fdPath[k] = rel
			}
			return nil, err
		}}
}

// fdOp runs f on the descriptor in slot k (EBADF when the slot is empty).
func (r *diffRun) fdOp(desc string, k int, keepsTree bool, check func(a, b any) string, f func(fd int) (any, error)) diffOp {
	if r.fds[0][k] >= 0 {
		desc += fmt.Sprintf(" (opened as %q)", r.fdPath[k])
	}
	return diffOp{desc: desc, keepsTree: keepsTree, check: check, onSide: func(side int, _ string) (any, error) {
		fd := r.fds[side][k]
		if fd < 0 {
			return nil, unix.EBADF
		}
		return f(fd)
	}}
}

func opFdWrite(r *diffRun) diffOp {
	k := r.slot()
	data := randBytes(r.rng, 1+r.rng.Intn(3000))
	off := r.rng.Int63n(6000)
	return r.fdOp(fmt.Sprintf("pwrite fd%d %d bytes at %d", k, len(data), off), k, false, equalResults, func(fd int) (any, error) {
		return unix.Pwrite(fd, data, off)
	})
}

func opFdRead(r *diffRun) diffOp {
	k := r.slot()
	return r.fdOp(fmt.Sprintf("pread fd%d", k), k, true, func(a, b any) string {
		if x, y := a.([]byte), b.([]byte); !bytes.Equal(x, y) {
			return fmt.Sprintf("content: plain dir %d bytes, sbxfs %d bytes (first difference at %d)", len(x), len(y), firstDiff(x, y))
		}
		return ""
	}, func(fd int) (any, error) {
		buf := make([]byte, 1<<20)
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	})
}

func opFdStat(r *diffRun) diffOp {
	k := r.slot()
	return r.fdOp(fmt.Sprintf("fstat fd%d", k), k, true, equalResults, func(fd int) (any, error) {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			// A merged directory reports one link, as on kernel
			// overlayfs (docs/design.md): compare files' counts only.
			return fmt.Sprintf("%s mode %#o", fileTypeName(st.Mode), st.Mode&0o7777), nil
		}
		return fmt.Sprintf("%s mode %#o size %d nlink %d", fileTypeName(st.Mode), st.Mode&0o7777, st.Size, st.Nlink), nil
	})
}

func opFdTruncate(r *diffRun) diffOp {
	k := r.slot()
	size := r.rng.Int63n(5000)
	return r.fdOp(fmt.Sprintf("ftruncate fd%d to %d", k, size), k, false, nil, func(fd int) (any, error) {
		return nil, unix.Ftruncate(fd, size)
	})
}

func opFdChmod(r *diffRun) diffOp {
	k := r.slot()
	mode := r.pickMode(fileModes)
	return r.fdOp(fmt.Sprintf("fchmod fd%d %#o", k, mode), k, true, nil, func(fd int) (any, error) {
		return nil, unix.Fchmod(fd, mode)
	})
}

func opFdSync(r *diffRun) diffOp {
	k := r.slot()
	return r.fdOp(fmt.Sprintf("fsync fd%d", k), k, true, nil, func(fd int) (any, error) {
		return nil, unix.Fsync(fd)
	})
}

func opFdClose(r *diffRun) diffOp {
	k := r.slot()
	return diffOp{desc: fmt.Sprintf("close fd%d", k), keepsTree: true, onSide: func(side int, _ string) (any, error) {
		fd := r.fds[side][k]
		if fd < 0 {
			return nil, unix.EBADF
		}
		r.fds[side][k] = -1
		return nil, unix.Close(fd)
	}}
}
