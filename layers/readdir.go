package layers

import (
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// DirEntry is one name of a merged directory listing.
type DirEntry struct {
	Name string
	Type uint32 // S_IFMT bits, 0 when unknown
	Ino  uint64 // stable inode number
}

// ReadDir lists the merged directory rel: the upper entries, then the lower
// entries not hidden by an upper entry, a whiteout or an opaque directory.
// The order is stable for an unchanged directory.
func (l *Layers) ReadDir(rel string, o Obj) ([]DirEntry, error) {
	upath, err := l.upperAt(rel)
	defer upath.Close()
	var up []dirent
	if err == nil {
		up, err = readDirents(upath.Path)
	}
	switch {
	case err == nil:
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
		if len(o.Lowers) == 0 {
			return nil, err
		}
	default:
		return nil, err
	}
	return l.mergeDir(upath.Path, up, o.Lowers)
}

// mergeDir lists the entries of the upper directory upath (up), then those
// of the lower directories lowers not hidden by an entry above, a
// whiteout or an opaque directory.
func (l *Layers) mergeDir(upath string, up []dirent, lowers []Origin) ([]DirEntry, error) {
	lowerLists := make([][]dirent, 0, len(lowers))
	total := len(up)
	for _, lo := range lowers {
		ents, err := l.readLowerDirents(lo)
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
			return nil, err // (gone from the original, or not a directory now: nothing to merge)
		}
		lowerLists = append(lowerLists, ents)
		total += len(ents)
	}
	out := make([]DirEntry, 0, total)
	// hidden holds the names listed or whited out so far, which hide the
	// same names in the layers below: needed only while one is left (a
	// directory of the original alone, the common case, needs no map).
	var hidden map[string]bool
	if len(up) > 0 && len(lowerLists) > 0 {
		hidden = make(map[string]bool, total)
	}
	var lowerNames map[string]bool // names the lower layers have
	if hidden != nil {
		lowerNames = make(map[string]bool, total-len(up))
		for _, ents := range lowerLists {
			for _, d := range ents {
				lowerNames[d.name] = true
			}
		}
	}
	for _, d := range up {
		p := upath + "/" + d.name
		if hidden != nil {
			hidden[d.name] = true
		}
		if d.typ == unix.DT_CHR || d.typ == unix.DT_UNKNOWN {
			var st unix.Stat_t
			if unix.Lstat(p, &st) == nil && fsutil.IsWhiteout(&st) {
				continue
			}
		}
		ino := l.stableIno(l.upperDev, d.ino)
		if lowerNames[d.name] {
			if og, ok := l.readOrigin(p); ok && og.ino != 0 {
				ino = og.ino
			}
		}
		out = append(out, DirEntry{Name: d.name, Type: dtToMode(d.typ), Ino: ino})
	}
	for i, ents := range lowerLists {
		below := i < len(lowerLists)-1 // a layer below is left
		if below && hidden == nil {
			hidden = make(map[string]bool, total)
		}
		dev := l.lowerDevs[lowers[i].Layer]
		var wh []string
		for _, d := range ents {
			if hidden[d.name] {
				continue
			}
			if d.typ == unix.DT_CHR || d.typ == unix.DT_UNKNOWN {
				var st unix.Stat_t
				if l.lowerLstat(lowers[i].child(d.name), &st) == nil && fsutil.IsWhiteout(&st) {
					wh = append(wh, d.name)
					continue
				}
			}
			if below {
				hidden[d.name] = true
			}
			out = append(out, DirEntry{Name: d.name, Type: dtToMode(d.typ), Ino: l.stableIno(dev, d.ino)})
		}
		if below {
			for _, n := range wh {
				hidden[n] = true // a lower whiteout hides the layers below only
			}
		}
	}
	return out, nil
}

type dirent struct {
	ino  uint64
	typ  uint8
	name string
}

// readDirents reads every entry of the directory at path but "." and "..",
// with the inode number and type the filesystem reports.
func readDirents(path string) ([]dirent, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return readDirentsFd(fd)
}

// readLowerDirents lists the lower directory o (lowerfs.go).
func (l *Layers) readLowerDirents(o Origin) ([]dirent, error) {
	fd, err := l.lowerOpen(o, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return readDirentsFd(fd)
}

// readDirentsFd lists the directory open at fd.
func readDirentsFd(fd int) ([]dirent, error) {
	var out []dirent
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		out = parseDirents(buf[:n], out)
	}
}

// parseDirents decodes linux_dirent64 records.
func parseDirents(b []byte, out []dirent) []dirent {
	for len(b) >= 19 {
		reclen := int(binary.NativeEndian.Uint16(b[16:18]))
		if reclen < 19 || reclen > len(b) {
			break
		}
		rec := b[:reclen]
		b = b[reclen:]
		name := rec[19:]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		if string(name) == "." || string(name) == ".." {
			continue
		}
		out = append(out, dirent{ino: binary.NativeEndian.Uint64(rec[0:8]), typ: rec[18], name: string(name)})
	}
	return out
}

func dtToMode(t uint8) uint32 {
	switch t {
	case unix.DT_REG:
		return unix.S_IFREG
	case unix.DT_DIR:
		return unix.S_IFDIR
	case unix.DT_LNK:
		return unix.S_IFLNK
	case unix.DT_FIFO:
		return unix.S_IFIFO
	case unix.DT_SOCK:
		return unix.S_IFSOCK
	case unix.DT_CHR:
		return unix.S_IFCHR
	case unix.DT_BLK:
		return unix.S_IFBLK
	}
	return 0
}
