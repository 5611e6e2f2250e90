package layers

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// xattrNames are the attribute names of the upper layout in one namespace.
type xattrNames struct {
	overlay  string // "trusted.overlay." or "user.overlay."
	opaque   string
	redirect string
	origin   string // sbxfs: the stable inode number and lower path of a copied-up object
	protattr string // the immutable/append-only flags of a copied-up original directory
}

func newXattrNames(user bool) xattrNames {
	p := "trusted.overlay."
	if user {
		p = "user.overlay."
	}
	return xattrNames{
		overlay:  p,
		opaque:   p + "opaque",
		redirect: p + "redirect",
		origin:   p + "sbxfs.origin",
		protattr: p + "protattr",
	}
}

// Private reports whether name is an attribute of the upper layout, hidden
// from users of the mount (as overlayfs hides its own): the
// Config.LayoutXattr of the stack's configuration.
func (l *Layers) Private(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, l.ns.overlay)
}

// LayoutXattr reports whether name is an attribute of the upper layout of
// a sandbox with this configuration, which never reaches an original:
// trusted.overlay.* always (hidden from the mount, as overlayfs hides
// it), and user.overlay.* when the sandbox keeps its layout there
// (UserXattrs, or not root). A sandbox kept in trusted.overlay.* shows
// user.overlay.* as an attribute like any other, and its commit carries
// it.
func (cfg Config) LayoutXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || cfg.userXattrs() && strings.HasPrefix(name, "user.overlay.")
}

var now = func() time.Time { return time.Now().UTC() }

// isOpaque reports whether the directory at path carries the opaque mark.
func (l *Layers) isOpaque(path string) bool {
	v, err := fsutil.LGetXattr(path, l.ns.opaque)
	return err == nil && len(v) == 1 && v[0] == 'y'
}

// redirectOf returns the redirect of the directory at path, "" if none.
// Absolute redirects are relative to every lower root; a relative one (as
// kernel overlayfs writes for a rename inside one directory) is a name in
// the lower parent directory, returned as is for the caller to resolve.
func (l *Layers) redirectOf(path string) string {
	v, err := fsutil.LGetXattr(path, l.ns.redirect)
	if err != nil {
		return ""
	}
	return string(v)
}

// origin is what sbxfs records on a copied-up object: its stable inode
// number and the lower object it came from.
type origin struct {
	ino   uint64
	layer int
	path  string
}

func (o origin) encode() []byte {
	return []byte(fmt.Sprintf("v1 %d %d %s", o.ino, o.layer, o.path))
}

func decodeOrigin(b []byte) (origin, error) {
	parts := strings.SplitN(string(b), " ", 4)
	if len(parts) != 4 || parts[0] != "v1" {
		return origin{}, errors.New("bad origin attribute")
	}
	ino, err1 := strconv.ParseUint(parts[1], 10, 64)
	layer, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil || layer < 0 {
		return origin{}, errors.New("bad origin attribute")
	}
	return origin{ino: ino, layer: layer, path: parts[3]}, nil
}

func (l *Layers) readOrigin(path string) (origin, bool) {
	v, err := fsutil.LGetXattr(path, l.ns.origin)
	if err != nil {
		return origin{}, false
	}
	if bytes.HasPrefix(v, []byte(storedOriginTag)) {
		v, err = l.loadOrigin(v)
		if err != nil {
			return origin{}, false
		}
	}
	o, err := decodeOrigin(v)
	if err != nil || o.layer >= len(l.lowers) {
		return origin{}, false
	}
	return o, true
}

func (l *Layers) setOrigin(fd int, o origin) error {
	v, err := l.originValue(o)
	if err == nil {
		err = unix.Fsetxattr(fd, l.ns.origin, v, 0)
	}
	if err != nil {
		return fmt.Errorf("set origin: %w", err)
	}
	return nil
}

// originInline bounds the lower path an origin attribute holds itself.
// ext4 keeps all the attributes of an inode in one block (4 KiB): a path
// deeper than that would not fit (ENOSPC), and the user's own attributes
// share the block. A longer path is kept in the work directory
// (originsDir), in a file named by its SHA-256, and the attribute names
// the file: "v1s INO LAYER SHA256".
const originInline = 1024

// storedOriginTag starts an origin attribute whose path is kept aside.
const storedOriginTag = "v1s "

// originsDir is where long origin paths are kept, in the work directory.
const originsDir = "origins"

// originValue returns the origin attribute for o, keeping a long path
// aside first (durably: the copy it belongs to is made durable before it
// is renamed into place).
func (l *Layers) originValue(o origin) ([]byte, error) {
	if len(o.path) <= originInline {
		return o.encode(), nil
	}
	sum := sha256.Sum256([]byte(o.path))
	name := hex.EncodeToString(sum[:])
	dir := filepath.Join(l.work, originsDir)
	p := filepath.Join(dir, name)
	if _, err := os.Lstat(p); err != nil {
		if err := os.Mkdir(dir, 0o700); err == nil {
			if err := fsutil.SyncDir(l.work); err != nil {
				return nil, err
			}
		} else if !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		if err := fsutil.WriteFileAtomic(p, []byte(o.path), 0o600); err != nil {
			return nil, err
		}
	}
	return fmt.Appendf(nil, "%s%d %d %s", storedOriginTag, o.ino, o.layer, name), nil
}

// loadOrigin turns a stored origin attribute v back into the inline form.
func (l *Layers) loadOrigin(v []byte) ([]byte, error) {
	parts := strings.SplitN(string(v), " ", 4)
	if len(parts) != 4 || len(parts[3]) != 2*sha256.Size || strings.Trim(parts[3], "0123456789abcdef") != "" {
		return nil, errors.New("bad origin attribute")
	}
	path, err := os.ReadFile(filepath.Join(l.work, originsDir, parts[3]))
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "v1 %s %s %s", parts[1], parts[2], path), nil
}

// Getxattr reads a user-visible attribute of the object at rel.
func (l *Layers) Getxattr(rel string, o Obj, name string, dest []byte) (int, error) {
	if l.Private(name) {
		return 0, unix.ENODATA
	}
	up, lower, err := l.real(rel, o)
	switch {
	case err != nil:
		return 0, err
	case lower:
		return l.lowerGetxattr(o.Lowers[0], name, dest)
	}
	defer up.Close()
	return unix.Lgetxattr(up.Path, name, dest)
}

// Listxattr lists the user-visible attribute names of the object at rel.
func (l *Layers) Listxattr(rel string, o Obj) ([]string, error) {
	up, lower, err := l.real(rel, o)
	if err != nil {
		return nil, err
	}
	var names []string
	if !lower {
		names, err = fsutil.LListXattrs(up.Path)
		up.Close()
	} else {
		names, err = l.lowerListxattrs(o.Lowers[0])
	}
	if err != nil {
		return nil, err
	}
	out := names[:0]
	for _, n := range names {
		if !l.Private(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Setxattr sets an attribute, copying the object up first.
func (l *Layers) Setxattr(rel string, o *Obj, name string, value []byte, flags int, c Caller) error {
	if l.Private(name) {
		return unix.EPERM
	}
	if err := o.mayChange(); err != nil {
		return err
	}
	if flags&(unix.XATTR_CREATE|unix.XATTR_REPLACE) != 0 && !o.Upper {
		// A create of an attribute there is, or a replace of one there
		// is not, fails without a change: check before the copy-up,
		// which would part a name of an original hard link.
		_, err := l.Getxattr(rel, *o, name, nil)
		switch {
		case err == nil && flags&unix.XATTR_CREATE != 0:
			return unix.EEXIST
		case errors.Is(err, unix.ENODATA) && flags&unix.XATTR_REPLACE != 0:
			return unix.ENODATA
		}
	}
	if err := l.record(OpSetxattr, rel, "", 0, c); err != nil {
		return err
	}
	if err := l.copyUpForMeta(rel, o); err != nil {
		return err
	}
	return l.UpperDo(rel, func(p string) error { return unix.Lsetxattr(p, name, value, flags) })
}

// Removexattr removes an attribute, copying the object up first.
func (l *Layers) Removexattr(rel string, o *Obj, name string, c Caller) error {
	if l.Private(name) {
		return unix.ENODATA
	}
	if err := o.mayChange(); err != nil {
		return err
	}
	// A missing attribute is an error without a change: check before copy-up.
	if _, err := l.Getxattr(rel, *o, name, nil); err != nil {
		return err
	}
	if err := l.record(OpRemovexattr, rel, "", 0, c); err != nil {
		return err
	}
	if err := l.copyUpForMeta(rel, o); err != nil {
		return err
	}
	return l.UpperDo(rel, func(p string) error { return unix.Lremovexattr(p, name) })
}

// The Fd variants act on an open upper descriptor: they reach a file that
// was unlinked while open (its changes are gone with it, so none is
// journaled).

// GetxattrFd reads a user-visible attribute through fd.
func (l *Layers) GetxattrFd(fd int, name string, dest []byte) (int, error) {
	if l.Private(name) {
		return 0, unix.ENODATA
	}
	return unix.Fgetxattr(fd, name, dest)
}

// ListxattrFd lists the user-visible attribute names through fd.
func (l *Layers) ListxattrFd(fd int) ([]string, error) {
	names, err := fsutil.ListXattrs(fd)
	if err != nil {
		return nil, err
	}
	out := names[:0]
	for _, n := range names {
		if !l.Private(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// SetxattrFd sets an attribute through fd.
func (l *Layers) SetxattrFd(fd int, name string, value []byte, flags int) error {
	if l.Private(name) {
		return unix.EPERM
	}
	return unix.Fsetxattr(fd, name, value, flags)
}

// RemovexattrFd removes an attribute through fd.
func (l *Layers) RemovexattrFd(fd int, name string) error {
	if l.Private(name) {
		return unix.ENODATA
	}
	return unix.Fremovexattr(fd, name)
}
