package commit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"golang.org/x/sys/unix"
)

// gitTree edits a git tree in memory: it loads only the trees on the
// paths it edits and writes back only those, so its cost follows the
// edited paths, not the size of the tree.
type gitTree struct {
	s    storer.EncodedObjectStorer
	root *gitTreeNode
}

type gitTreeNode struct {
	hash    plumbing.Hash            // the stored tree; zero for a new one
	entries map[string]*gitTreeEntry // nil until loaded
	dirty   bool
}

type gitTreeEntry struct {
	mode filemode.FileMode
	hash plumbing.Hash
	sub  *gitTreeNode // a tree entry once descended into
}

// errInSubmodule refuses a path inside a submodule, as git does.
var errInSubmodule = errors.New("is inside a submodule")

func newGitTree(s storer.EncodedObjectStorer, root plumbing.Hash) *gitTree {
	return &gitTree{s: s, root: &gitTreeNode{hash: root}}
}

func (t *gitTree) load(n *gitTreeNode) error {
	if n.entries != nil {
		return nil
	}
	n.entries = map[string]*gitTreeEntry{}
	if n.hash.IsZero() {
		return nil
	}
	tr, err := object.GetTree(t.s, n.hash)
	if err != nil {
		return fmt.Errorf("read tree %s: %w", n.hash, err)
	}
	for _, e := range tr.Entries {
		n.entries[e.Name] = &gitTreeEntry{mode: e.Mode, hash: e.Hash}
	}
	return nil
}

// parent returns the node of the directory holding p and p's last
// component. With create it makes missing directories (replacing a
// non-directory in the way) and marks the way dirty; without, it returns
// a nil node when the directory is not in the tree.
func (t *gitTree) parent(p string, create bool) (*gitTreeNode, string, error) {
	n := t.root
	comps := strings.Split(p, "/")
	for i, c := range comps[:len(comps)-1] {
		if err := t.load(n); err != nil {
			return nil, "", err
		}
		e := n.entries[c]
		switch {
		case e != nil && e.mode == filemode.Submodule:
			return nil, "", fmt.Errorf("%q %w %q", p, errInSubmodule, strings.Join(comps[:i+1], "/"))
		case e == nil || e.mode != filemode.Dir:
			if !create {
				return nil, "", nil
			}
			e = &gitTreeEntry{mode: filemode.Dir, sub: &gitTreeNode{entries: map[string]*gitTreeEntry{}}}
			n.entries[c] = e
		case e.sub == nil:
			e.sub = &gitTreeNode{hash: e.hash}
		}
		n.dirty = n.dirty || create
		n = e.sub
	}
	return n, comps[len(comps)-1], t.load(n)
}

// set makes p a file of the given mode and blob.
func (t *gitTree) set(p string, mode filemode.FileMode, blob plumbing.Hash) error {
	n, name, err := t.parent(p, true)
	if err != nil {
		return err
	}
	if e := n.entries[name]; e != nil && e.mode == filemode.Submodule {
		return fmt.Errorf("%q is a submodule; commit in the submodule instead", p)
	}
	n.entries[name] = &gitTreeEntry{mode: mode, hash: blob}
	n.dirty = true
	return nil
}

// remove takes p, and everything beneath it, out of the tree. With
// nonDir only a non-directory (and not a submodule) at p is removed.
func (t *gitTree) remove(p string, nonDir bool) error {
	n, name, err := t.parent(p, false)
	if err != nil || n == nil {
		return err
	}
	e := n.entries[name]
	if e == nil || nonDir && (e.mode == filemode.Dir || e.mode == filemode.Submodule) {
		return nil
	}
	// Mark the way dirty now that there is something to remove.
	if _, _, err := t.parent(p, true); err != nil {
		return err
	}
	delete(n.entries, name)
	n.dirty = true
	return nil
}

// removeDir takes a directory or a submodule at p out of the tree, with
// everything beneath it; a non-directory at p stays.
func (t *gitTree) removeDir(p string) error {
	n, name, err := t.parent(p, false)
	if err != nil || n == nil {
		return err
	}
	if e := n.entries[name]; e == nil || e.mode != filemode.Dir && e.mode != filemode.Submodule {
		return nil
	}
	return t.remove(p, false)
}

// removeExcept takes p and everything beneath it out of the tree, but
// what lies at or beneath one of keep, and returns the paths it took out.
func (t *gitTree) removeExcept(p string, keep []string) ([]string, error) {
	var mine []string
	for _, k := range keep {
		if k == p {
			return nil, nil // p itself stays, whole
		}
		if strings.HasPrefix(k, p+"/") {
			mine = append(mine, k)
		}
	}
	if len(mine) == 0 {
		return []string{p}, t.remove(p, false)
	}
	n, name, err := t.parent(p, false)
	if err != nil || n == nil {
		return nil, err
	}
	e := n.entries[name]
	switch {
	case e == nil:
		return nil, nil
	case e.mode != filemode.Dir:
		return []string{p}, t.remove(p, false)
	case e.sub == nil:
		e.sub = &gitTreeNode{hash: e.hash}
	}
	if err := t.load(e.sub); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(e.sub.entries))
	for c := range e.sub.entries {
		names = append(names, c)
	}
	sort.Strings(names)
	var removed []string
	for _, c := range names {
		r, err := t.removeExcept(p+"/"+c, mine)
		if err != nil {
			return nil, err
		}
		removed = append(removed, r...)
	}
	return removed, nil
}

// write stores every changed tree and returns the root tree's hash.
func (t *gitTree) write() (plumbing.Hash, error) {
	if err := t.load(t.root); err != nil {
		return plumbing.ZeroHash, err
	}
	t.root.dirty = true // an unborn branch's first tree may be empty
	h, _, err := t.writeNode(t.root, true)
	return h, err
}

// writeNode stores n when it changed; an empty directory other than the
// root is dropped (git keeps no empty trees).
func (t *gitTree) writeNode(n *gitTreeNode, root bool) (plumbing.Hash, bool, error) {
	if !n.dirty {
		return n.hash, false, nil
	}
	var tr object.Tree
	for name, e := range n.entries {
		if e.sub != nil {
			h, empty, err := t.writeNode(e.sub, false)
			if err != nil {
				return plumbing.ZeroHash, false, err
			}
			if empty {
				continue
			}
			e.hash = h
		}
		tr.Entries = append(tr.Entries, object.TreeEntry{Name: name, Mode: e.mode, Hash: e.hash})
	}
	if len(tr.Entries) == 0 && !root {
		return plumbing.ZeroHash, true, nil
	}
	sort.Sort(object.TreeEntrySorter(tr.Entries))
	obj := t.s.NewEncodedObject()
	if err := tr.Encode(obj); err != nil {
		return plumbing.ZeroHash, false, err
	}
	h, err := t.s.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, false, fmt.Errorf("write tree: %w", err)
	}
	n.hash, n.dirty = h, false
	return h, false, nil
}

// lazyObjectWriter is the streaming writer of go-git's filesystem
// storage: a blob goes to disk without being held in memory.
type lazyObjectWriter interface {
	LazyWriter() (io.WriteCloser, func(plumbing.ObjectType, int64) error, error)
}

// writeBlob stores the size bytes of r as a blob.
func writeBlob(s storer.EncodedObjectStorer, r io.Reader, size int64) (plumbing.Hash, error) {
	if lw, ok := s.(lazyObjectWriter); ok {
		w, header, err := lw.LazyWriter()
		if err != nil {
			return plumbing.ZeroHash, err
		}
		hw, ok := w.(interface{ Hash() plumbing.Hash })
		if ok {
			if err := header(plumbing.BlobObject, size); err != nil {
				return plumbing.ZeroHash, err
			}
			// A short copy leaves the object unsaved: closing it would
			// store content that does not match its header.
			if _, err := io.CopyN(w, r, size); err != nil {
				return plumbing.ZeroHash, fmt.Errorf("file changed while being read: %w", err)
			}
			if err := w.Close(); err != nil {
				return plumbing.ZeroHash, err
			}
			return hw.Hash(), nil
		}
		w.Close()
	}
	obj := s.NewEncodedObject()
	obj.SetType(plumbing.BlobObject)
	obj.SetSize(size)
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := io.CopyN(w, r, size); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("file changed while being read: %w", err)
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	return s.SetEncodedObject(obj)
}

// gitWorkFile is the state of one committed path in the work tree.
type gitWorkFile struct {
	exists bool
	// special: a FIFO, socket or device, which the commit leaves out
	// (git add -A passes over them too).
	special bool
	st      unix.Stat_t
	mode    filemode.FileMode // of a file or symlink; Dir for a directory
	blob    plumbing.Hash
}

// readWorkFile stats p beneath the work tree top (no symlink followed in
// any component: a path behind a symlink is missing, as for git) and
// stores the blob of a file or symlink.
func readWorkFile(s storer.EncodedObjectStorer, top int, p string) (gitWorkFile, error) {
	var f gitWorkFile
	dir, base, ok, err := lstatBeneath(top, p, &f.st, nil)
	if err != nil || !ok {
		return f, err
	}
	if dir != top {
		defer unix.Close(dir)
	}
	f.exists = true
	switch f.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		f.mode = filemode.Dir
	case unix.S_IFLNK:
		target, err := readlinkAt(dir, base)
		if err != nil {
			return f, err
		}
		f.mode = filemode.Symlink
		f.blob, err = writeBlob(s, strings.NewReader(target), int64(len(target)))
		return f, err
	case unix.S_IFREG:
		f.mode = filemode.Regular
		if f.st.Mode&unix.S_IXUSR != 0 {
			f.mode = filemode.Executable
		}
		return f, f.storeFile(s, dir, base)
	default:
		f.special = true // a FIFO, socket or device: git holds none
	}
	return f, nil
}

func (f *gitWorkFile) storeFile(s storer.EncodedObjectStorer, dir int, name string) error {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	file := os.NewFile(uintptr(fd), name)
	defer file.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Ino != f.st.Ino || st.Dev != f.st.Dev {
		return fmt.Errorf("%s was replaced while being read; retry", name)
	}
	f.st = st
	f.blob, err = writeBlob(s, file, st.Size)
	return err
}
