package tests

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// The second set of differential operations: directories held open and
// the *at calls made relative to them while they are renamed, replaced
// and removed (the node tree's paths), ownership, fallocate,
// copy_file_range, writes through mmap, O_TMPFILE, and paths through
// symlinks to directories. A seed's history
// depends on the set it draws from, so the regression seeds say which set
// they were found with (diffCommitSeeds), and -diff.opset 1 reruns a
// history found before this set.

const diffOpSetLatest = 3

// diffOpSetChurn names, for a regression seed, the operations of
// -diff.churn (diffChurnOps) instead of a numbered set.
const diffOpSetChurn = -1

var flagDiffOpSet = flag.Int("diff.opset", diffOpSetLatest, "operations the differential tests draw from: "+
	"1 (files, directories, links, xattrs, descriptors), 2 (also directories held open and *at calls, chown, fallocate, copy_file_range, mmap, O_TMPFILE), "+
	"3 (also rm -rf of a tree and making a removed tree again, as git checkout does)")

var diffOps2 = []weightedOp{
	{3, opDirOpen}, {10, opDirAt}, {2, opDirList}, {2, opDirMeta}, {3, opDirMove},
	{4, opChown}, {1, opFdChown}, {2, opFdFallocate}, {2, opFdCopyRange}, {2, opFdMmapWrite},
	{2, opTmpfile}, {3, opViaSymlink},
}

// diffOpsOf returns the operations of set n.
func diffOpsOf(n int) []weightedOp {
	switch {
	case n <= 1:
		return diffOps
	case n == 2:
		return slices.Concat(diffOps, diffOps2)
	}
	return slices.Concat(diffOps, diffOps2, diffOps3)
}

var diffOwners = []int{0, 1000, 65534, -1}

// pickOwners picks an owner and a group to give (-1: keep). chown(-1,
// -1) changes only the ctime; kernel overlayfs copies the object up for
// it and sbxfs does not (docs/design.md): -diff.avoid noopchown leaves
// it out.
func (r *diffRun) pickOwners() (uid, gid int) {
	uid, gid = diffOwners[r.rng.Intn(len(diffOwners))], diffOwners[r.rng.Intn(len(diffOwners))]
	if uid == -1 && gid == -1 && avoiding("noopchown") {
		uid = 0
	}
	return uid, gid
}

// dirRel returns the path (in the plain directory) of the directory held
// in dir slot k now, and false when the slot is empty or the directory is
// gone.
func (r *diffRun) dirRel(k int) (string, bool) {
	fd := r.dfds[0][k]
	if fd < 0 {
		return "", false
	}
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil || strings.HasSuffix(link, " (deleted)") {
		return "", false
	}
	rel, err := filepath.Rel(r.ref, link)
	if err != nil || strings.HasPrefix(rel, "..") {
		r.t.Fatalf("dir slot %d: %s is outside the plain directory %s", k, link, r.ref)
	}
	if rel == "." {
		rel = ""
	}
	return rel, true
}

// nameIn picks a name in dir: one of its entries (often), else one of
// the generator's names.
func (r *diffRun) nameIn(dir string) string {
	if r.rng.Intn(4) != 0 {
		var c []string
		for _, e := range r.ents {
			parent := filepath.Dir(e.rel)
			if parent == "." {
				parent = ""
			}
			if parent == dir {
				c = append(c, filepath.Base(e.rel))
			}
		}
		if len(c) > 0 {
			return c[r.rng.Intn(len(c))]
		}
	}
	return diffNames[r.rng.Intn(len(diffNames))]
}

// dirOp runs f on the directory descriptor in slot k (EBADF when empty).
func (r *diffRun) dirOp(desc string, k int, keepsTree bool, check func(a, b any) string, f func(dfd int) (any, error)) diffOp {
	return diffOp{desc: desc, keepsTree: keepsTree, check: check, onSide: func(side int, _ string) (any, error) {
		fd := r.dfds[side][k]
		if fd < 0 {
			return nil, unix.EBADF
		}
		return f(fd)
	}}
}

// dirSlotDesc names slot k and where its directory is now.
func (r *diffRun) dirSlotDesc(k int) (desc, rel string, live bool) {
	rel, live = r.dirRel(k)
	switch {
	case r.dfds[0][k] < 0:
		return fmt.Sprintf("dfd%d (closed)", k), "", false
	case !live:
		return fmt.Sprintf("dfd%d (opened as %q, gone)", k, r.dfdPath[k]), "", false
	}
	return fmt.Sprintf("dfd%d (opened as %q, now %q)", k, r.dfdPath[k], rel), rel, true
}

func opDirOpen(r *diffRun) diffOp {
	k := r.slot()
	rel := r.dir()
	if r.rng.Intn(8) == 0 {
		rel = r.existing(anyEnt) // ENOTDIR now and then
	}
	return diffOp{desc: fmt.Sprintf("dfd%d = open %q O_DIRECTORY", k, rel), keepsTree: true,
		onSide: func(side int, root string) (any, error) {
			if fd := r.dfds[side][k]; fd >= 0 {
				unix.Close(fd)
				r.dfds[side][k] = -1
			}
			fd, err := unix.Open(filepath.Join(root, rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err == nil {
				r.dfds[side][k] = fd
				r.dfdPath[k] = rel
			}
			return nil, err
		}}
}

// opDirAt makes a call relative to a directory held open.
func opDirAt(r *diffRun) diffOp {
	k := r.slot()
	sd, dir, live := r.dirSlotDesc(k)
	in := func(name string) []string {
		if !live {
			return nil
		}
		return []string{filepath.Join(dir, name)}
	}
	name := r.nameIn(dir)
	switch r.rng.Intn(11) {
	case 0:
		flags, mode, data := r.createArgs()
		op := r.dirOp(fmt.Sprintf("openat %s %q %s mode %#o, write %d bytes", sd, name, openFlagsName(flags), mode, len(data)), k, false, equalResults,
			func(dfd int) (any, error) {
				fd, err := unix.Openat(dfd, name, flags|unix.O_CLOEXEC|unix.O_NONBLOCK, mode)
				if err != nil {
					return nil, err
				}
				n, err := unix.Write(fd, data)
				if cerr := unix.Close(fd); err == nil {
					err = cerr
				}
				return n, err
			})
		op.parts = in(name)
		return op
	case 1:
		mode := r.pickMode([]uint32{0o755, 0o700, 0o2775, 0o1777})
		return r.dirOp(fmt.Sprintf("mkdirat %s %q %#o", sd, name, mode), k, false, nil, func(dfd int) (any, error) {
			return nil, unix.Mkdirat(dfd, name, mode)
		})
	case 2, 3:
		flags, what := 0, "unlinkat"
		if r.rng.Intn(3) == 0 {
			flags, what = unix.AT_REMOVEDIR, "unlinkat AT_REMOVEDIR"
		}
		op := r.dirOp(fmt.Sprintf("%s %s %q", what, sd, name), k, false, nil, func(dfd int) (any, error) {
			return nil, unix.Unlinkat(dfd, name, flags)
		})
		op.drops = in(name)
		return op
	case 4:
		to := r.nameIn(dir)
		var flags uint
		what := "renameat2"
		switch r.rng.Intn(5) {
		case 0:
			flags, what = unix.RENAME_NOREPLACE, "renameat2 NOREPLACE"
		case 1:
			flags, what = unix.RENAME_EXCHANGE, "renameat2 EXCHANGE"
		}
		op := r.dirOp(fmt.Sprintf("%s %s %q -> %q", what, sd, name, to), k, false, nil, func(dfd int) (any, error) {
			return nil, unix.Renameat2(dfd, name, dfd, to, flags)
		})
		op.nofollow = true
		switch {
		case name == to:
		case flags == unix.RENAME_EXCHANGE:
			op.parts = append(in(name), in(to)...)
		default:
			op.parts, op.drops = in(name), in(to)
		}
		return op
	case 5:
		// Out of the directory, to a path from the root.
		to := r.newPath()
		if r.rng.Intn(3) == 0 {
			to = r.existing(anyEnt)
		}
		op := diffOp{desc: fmt.Sprintf("renameat %s %q -> %q", sd, name, to), onSide: func(side int, root string) (any, error) {
			fd := r.dfds[side][k]
			if fd < 0 {
				return nil, unix.EBADF
			}
			return nil, unix.Renameat(fd, name, unix.AT_FDCWD, filepath.Join(root, to))
		}, nofollow: true}
		if in(name) != nil && in(name)[0] != to {
			op.parts, op.drops = in(name), []string{to}
		}
		return op
	case 6:
		// Into the directory, from a path from the root.
		from := r.existing(anyEnt)
		op := diffOp{desc: fmt.Sprintf("renameat %q -> %s %q", from, sd, name), onSide: func(side int, root string) (any, error) {
			fd := r.dfds[side][k]
			if fd < 0 {
				return nil, unix.EBADF
			}
			return nil, unix.Renameat(unix.AT_FDCWD, filepath.Join(root, from), fd, name)
		}, nofollow: true}
		if in(name) != nil && in(name)[0] != from {
			op.parts, op.drops = []string{from}, in(name)
		}
		return op
	case 7:
		return r.dirOp(fmt.Sprintf("fstatat %s %q", sd, name), k, true, equalResults, func(dfd int) (any, error) {
			var st unix.Stat_t
			if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return nil, err
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return fmt.Sprintf("%s mode %#o uid %d gid %d", fileTypeName(st.Mode), st.Mode&0o7777, st.Uid, st.Gid), nil
			}
			return fmt.Sprintf("%s mode %#o size %d nlink %d uid %d gid %d", fileTypeName(st.Mode), st.Mode&0o7777, st.Size, st.Nlink, st.Uid, st.Gid), nil
		})
	case 8:
		if r.rng.Intn(2) == 0 {
			mode := r.pickMode(fileModes)
			op := r.dirOp(fmt.Sprintf("fchmodat %s %q %#o", sd, name, mode), k, true, nil, func(dfd int) (any, error) {
				return nil, unix.Fchmodat(dfd, name, mode, 0)
			})
			op.parts = in(name)
			return op
		}
		uid, gid := r.pickOwners()
		op := r.dirOp(fmt.Sprintf("fchownat %s %q %d:%d nofollow", sd, name, uid, gid), k, true, nil, func(dfd int) (any, error) {
			return nil, unix.Fchownat(dfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		})
		if uid != -1 || gid != -1 {
			op.parts, op.nofollow = in(name), true
		}
		return op
	case 9:
		target := []string{"f01", "n0", "x", "missing", "b", "ln"}[r.rng.Intn(6)]
		return r.dirOp(fmt.Sprintf("symlinkat %s %q -> %q", sd, name, target), k, false, nil, func(dfd int) (any, error) {
			return nil, unix.Symlinkat(target, dfd, name)
		})
	default:
		to := r.nameIn(dir)
		op := r.dirOp(fmt.Sprintf("linkat %s %q -> %q", sd, name, to), k, false, nil, func(dfd int) (any, error) {
			return nil, unix.Linkat(dfd, name, dfd, to, 0)
		})
		op.parts, op.nofollow = in(name), true
		return op
	}
}

// opDirList rewinds a directory held open and lists it: what was made and
// removed since it was opened must show.
func opDirList(r *diffRun) diffOp {
	k := r.slot()
	sd, _, _ := r.dirSlotDesc(k)
	return r.dirOp(fmt.Sprintf("rewind and list %s", sd), k, true, equalResults, func(dfd int) (any, error) {
		if _, err := unix.Seek(dfd, 0, 0); err != nil {
			return nil, err
		}
		var names []string
		buf := make([]byte, 8<<10)
		for {
			n, err := unix.Getdents(dfd, buf)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				break
			}
			_, _, names = unix.ParseDirent(buf[:n], -1, names)
		}
		slices.Sort(names)
		return strings.Join(names, ","), nil
	})
}

// opDirMeta changes or reads a directory held open through its descriptor.
func opDirMeta(r *diffRun) diffOp {
	k := r.slot()
	sd, _, live := r.dirSlotDesc(k)
	what := r.rng.Intn(5)
	if what == 2 && !live {
		// The extended attributes of a directory removed while open are
		// gone with it (docs/design.md, departures): ENOENT, where ext4
		// changes the orphan inode.
		what = 4
	}
	switch what {
	case 0:
		mode := r.pickMode([]uint32{0o755, 0o700, 0o2775, 0o1777, 0o555, 0o000})
		return r.dirOp(fmt.Sprintf("fchmod %s %#o", sd, mode), k, true, nil, func(dfd int) (any, error) {
			return nil, unix.Fchmod(dfd, mode)
		})
	case 1:
		uid, gid := r.pickOwners()
		return r.dirOp(fmt.Sprintf("fchown %s %d:%d", sd, uid, gid), k, true, nil, func(dfd int) (any, error) {
			return nil, unix.Fchown(dfd, uid, gid)
		})
	case 2:
		name := xattrNames[r.rng.Intn(len(xattrNames))]
		val := randBytes(r.rng, r.rng.Intn(100))
		return r.dirOp(fmt.Sprintf("fsetxattr %s %s (%d bytes)", sd, name, len(val)), k, true, nil, func(dfd int) (any, error) {
			return nil, unix.Fsetxattr(dfd, name, val, 0)
		})
	case 3:
		return r.dirOp(fmt.Sprintf("fsync %s", sd), k, true, nil, func(dfd int) (any, error) {
			return nil, unix.Fsync(dfd)
		})
	default:
		return r.dirOp(fmt.Sprintf("fstat %s", sd), k, true, equalResults, func(dfd int) (any, error) {
			var st unix.Stat_t
			if err := unix.Fstat(dfd, &st); err != nil {
				return nil, err
			}
			return fmt.Sprintf("%s mode %#o uid %d gid %d", fileTypeName(st.Mode), st.Mode&0o7777, st.Uid, st.Gid), nil
		})
	}
}

// opDirMove renames or removes a directory held open, or its parent.
func opDirMove(r *diffRun) diffOp {
	k := r.slot()
	sd, rel, live := r.dirSlotDesc(k)
	if !live || rel == "" {
		return opDirOpen(r)
	}
	src := rel
	if r.rng.Intn(4) == 0 && strings.Contains(rel, "/") {
		src = filepath.Dir(rel)
	}
	var dst string
	switch r.rng.Intn(5) {
	case 0:
		return diffOp{desc: fmt.Sprintf("rmdir %q (%s)", src, sd), do: func(root string) (any, error) {
			return nil, unix.Rmdir(filepath.Join(root, src))
		}}
	case 1:
		dst = r.existing(isDirEnt) // over a directory, maybe empty
	case 2:
		dst = r.existing(anyEnt)
	default:
		dst = r.newPath()
	}
	var flags uint
	what := "rename"
	if r.rng.Intn(5) == 0 {
		flags, what = unix.RENAME_EXCHANGE, "rename EXCHANGE"
	}
	return renameOp(fmt.Sprintf("%s %q -> %q (%s)", what, src, dst, sd), src, dst, flags)
}

func opChown(r *diffRun) diffOp {
	rel := r.existing(anyEnt)
	uid, gid := r.pickOwners()
	follow := r.rng.Intn(3) == 0
	what := "lchown"
	if follow {
		what = "chown"
	}
	op := diffOp{desc: fmt.Sprintf("%s %q %d:%d", what, rel, uid, gid), do: func(root string) (any, error) {
		p := filepath.Join(root, rel)
		if follow {
			return nil, unix.Chown(p, uid, gid)
		}
		return nil, unix.Lchown(p, uid, gid)
	}, keepsTree: true, nofollow: !follow}
	if uid != -1 || gid != -1 {
		// chown(-1, -1) of a file without setuid or setgid bits (as the
		// original's hard links are until a chmod parts them) changes
		// its ctime alone: no copy-up.
		op.parts = []string{rel}
	}
	return op
}

func opFdChown(r *diffRun) diffOp {
	k := r.slot()
	uid, gid := r.pickOwners()
	return r.fdOp(fmt.Sprintf("fchown fd%d %d:%d", k, uid, gid), k, true, nil, func(fd int) (any, error) {
		return nil, unix.Fchown(fd, uid, gid)
	})
}

func opFdFallocate(r *diffRun) diffOp {
	k := r.slot()
	modes := []struct {
		mode uint32
		name string
	}{
		{0, "0"}, {unix.FALLOC_FL_KEEP_SIZE, "KEEP_SIZE"},
		{unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, "PUNCH_HOLE|KEEP_SIZE"},
		{unix.FALLOC_FL_ZERO_RANGE, "ZERO_RANGE"}, {unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE, "ZERO_RANGE|KEEP_SIZE"},
	}
	m := modes[r.rng.Intn(len(modes))]
	off, size := r.rng.Int63n(8000), 1+r.rng.Int63n(6000)
	return r.fdOp(fmt.Sprintf("fallocate fd%d %s %d+%d", k, m.name, off, size), k, false, nil, func(fd int) (any, error) {
		return nil, unix.Fallocate(fd, m.mode, off, size)
	})
}

func opFdCopyRange(r *diffRun) diffOp {
	from, to := r.slot(), r.slot()
	offIn, offOut, n := r.rng.Int63n(5000), r.rng.Int63n(8000), 1+r.rng.Intn(6000)
	desc := fmt.Sprintf("copy_file_range fd%d@%d -> fd%d@%d, %d bytes", from, offIn, to, offOut, n)
	return diffOp{desc: desc, check: equalResults, onSide: func(side int, _ string) (any, error) {
		in, out := r.fds[side][from], r.fds[side][to]
		if in < 0 || out < 0 {
			return nil, unix.EBADF
		}
		oi, oo := offIn, offOut
		return unix.CopyFileRange(in, &oi, out, &oo, n, 0)
	}}
}

// opFdMmapWrite writes into a file held open through a shared mapping of
// it (its size now; a share of it picked by the generator), then msyncs.
func opFdMmapWrite(r *diffRun) diffOp {
	k := r.slot()
	at := r.rng.Float64()
	data := randBytes(r.rng, 1+r.rng.Intn(3000))
	return r.fdOp(fmt.Sprintf("mmap fd%d, write %d bytes at %.2f of its size, msync", k, len(data), at), k, true, equalResults, func(fd int) (any, error) {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, err
		}
		if st.Size == 0 {
			return 0, nil
		}
		m, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, err
		}
		off := int(at * float64(st.Size))
		n := copy(m[off:], data)
		err = unix.Msync(m, unix.MS_SYNC)
		if uerr := unix.Munmap(m); err == nil {
			err = uerr
		}
		return n, err
	})
}

// opTmpfile makes an unnamed file in a directory, writes it and (mostly)
// links it into the tree.
func opTmpfile(r *diffRun) diffOp {
	dir := r.dir()
	mode := r.pickMode(fileModes)
	data := randBytes(r.rng, r.rng.Intn(3000))
	link := ""
	if r.rng.Intn(4) != 0 {
		link = r.newPath()
	}
	return diffOp{desc: fmt.Sprintf("O_TMPFILE in %q mode %#o, write %d bytes, link as %q", dir, mode, len(data), link), check: equalResults,
		do: func(root string) (any, error) {
			fd, err := unix.Open(filepath.Join(root, dir), unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, mode)
			if err != nil {
				return nil, err
			}
			defer unix.Close(fd)
			n, err := unix.Write(fd, data)
			if err != nil || link == "" {
				return n, err
			}
			return n, unix.Linkat(fd, "", unix.AT_FDCWD, filepath.Join(root, link), unix.AT_EMPTY_PATH)
		}}
}

// opViaSymlink reaches a name in a directory through a symlink to it.
func opViaSymlink(r *diffRun) diffOp {
	type dirLink struct{ link, dir string }
	var c []dirLink
	for _, e := range r.ents {
		if e.mode&unix.S_IFMT != unix.S_IFLNK {
			continue
		}
		real, err := filepath.EvalSymlinks(filepath.Join(r.ref, e.rel))
		if err != nil {
			continue
		}
		var st unix.Stat_t
		rel, err := filepath.Rel(r.ref, real)
		if err != nil || strings.HasPrefix(rel, "..") || unix.Stat(real, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if rel == "." {
			rel = ""
		}
		c = append(c, dirLink{e.rel, rel})
	}
	if len(c) == 0 {
		return opSymlink(r)
	}
	l := c[r.rng.Intn(len(c))]
	name := r.nameIn(l.dir)
	via, real := filepath.Join(l.link, name), filepath.Join(l.dir, name)
	at := fmt.Sprintf("%q (%q through the symlink %q)", via, real, l.link)
	switch r.rng.Intn(5) {
	case 0:
		data := randBytes(r.rng, 1+r.rng.Intn(2000))
		return writeOp(fmt.Sprintf("append %d bytes to %s", len(data), at), via, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT, 0o644, data, -1)
	case 1:
		return diffOp{desc: "lstat " + at, keepsTree: true, check: equalResults, do: func(root string) (any, error) {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, via), &st); err != nil {
				return nil, err
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return fmt.Sprintf("%s mode %#o", fileTypeName(st.Mode), st.Mode&0o7777), nil
			}
			return fmt.Sprintf("%s mode %#o size %d nlink %d", fileTypeName(st.Mode), st.Mode&0o7777, st.Size, st.Nlink), nil
		}}
	case 2:
		return diffOp{desc: "unlink " + at, do: func(root string) (any, error) {
			return nil, unix.Unlink(filepath.Join(root, via))
		}, drops: []string{real}}
	case 3:
		return diffOp{desc: "mkdir " + at, do: func(root string) (any, error) {
			return nil, unix.Mkdir(filepath.Join(root, via), 0o755)
		}}
	default:
		to := r.newPath()
		op := diffOp{desc: fmt.Sprintf("rename %s -> %q", at, to), do: func(root string) (any, error) {
			return nil, unix.Rename(filepath.Join(root, via), filepath.Join(root, to))
		}, nofollow: true}
		if real != to {
			op.parts, op.drops = []string{real}, []string{to}
		}
		return op
	}
}
