package commit

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// The original side of a diff: the original directory, or for a sandbox
// over several lower layers their merged view (layers.LowerView), which
// is what the mount showed before the sandbox changed it.

// openLowers opens every lower layer of cfg and the merged view of them.
func (r *diffReader) openLowers(cfg layers.Config) error {
	view, err := layers.OpenLowerView(cfg)
	if err != nil {
		return fmt.Errorf("diff: %w", err)
	}
	r.view = view
	for _, d := range cfg.Lowers {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("diff: open lower layer %q: %w", d, err)
		}
		r.lowers = append(r.lowers, fd)
	}
	return nil
}

// inOrig returns the root (an O_PATH descriptor the reader holds) and the
// path beneath it of the original's object at rel; ok is false when the
// original has none.
func (r *diffReader) inOrig(rel string) (root int, at string, ok bool, err error) {
	if r.view == nil {
		return r.orig, rel, true, nil
	}
	layer, at, ok, err := r.view.Find(rel)
	if err != nil || !ok {
		return -1, "", false, err
	}
	return r.lowers[layer], at, true, nil
}

// readOrig reads the original's object at rel (readSide).
func (r *diffReader) readOrig(rel string, opts pairOpts) (diffSide, error) {
	root, at, ok, err := r.inOrig(rel)
	if err != nil || !ok {
		return diffSide{}, err
	}
	return r.readSide(root, at, opts)
}

// origEntry is a name of an original directory and its type.
type origEntry struct {
	name string
	typ  os.FileMode
}

// listOrig lists the original's directory rel, in name order.
func (r *diffReader) listOrig(rel string) ([]origEntry, error) {
	var out []origEntry
	if r.view == nil {
		fd, err := fsutil.OpenBeneath(r.orig, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(fd), rel)
		ents, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			out = append(out, origEntry{e.Name(), e.Type()})
		}
	} else {
		ents, err := r.view.ReadDir(rel)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			mode := e.Type
			if mode == 0 {
				side, err := r.readOrig(layers.Join(rel, e.Name), pairOpts{noContent: true})
				if err != nil {
					return nil, err
				}
				mode = side.mode
			}
			out = append(out, origEntry{e.Name, fileModeType(mode)})
		}
	}
	slices.SortFunc(out, func(a, b origEntry) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// fileModeType is the os.FileMode type bits of an st_mode.
func fileModeType(mode uint32) os.FileMode {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return os.ModeDir
	case unix.S_IFLNK:
		return os.ModeSymlink
	case unix.S_IFIFO:
		return os.ModeNamedPipe
	case unix.S_IFSOCK:
		return os.ModeSocket
	case unix.S_IFCHR:
		return os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		return os.ModeDevice
	}
	return 0
}
