package commit

import (
	"errors"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// held is what the original held, right after the conflict check, at a
// path the apply moves into the backups: nothing, a non-directory, or a
// directory with everything beneath it. The backups go at the commit
// point, so the apply and Sync refuse to back up anything else: a write
// or a new entry made since would be lost with them.
type held struct {
	there bool
	st    unix.Stat_t
	// beneath is, for a directory, every object beneath it by its path
	// relative to the directory.
	beneath map[string]unix.Stat_t
}

// heldObjects records what the original holds at the path of each step
// that moves an object into the backups, by the step's slot. Beneath a
// directory recorded whole, whose detach comes first and takes what is
// beneath it, a later detach must find nothing.
func heldObjects(orig *tree, steps []step, r renames) (map[string]held, error) {
	out := map[string]held{}
	dirs := map[string]string{} // final path -> original path, of directories recorded whole
	for _, s := range steps {
		if s.Kind != opDetach || !strings.HasPrefix(s.Slot, "b/") {
			continue
		}
		p := backedUpFrom(r, s.Path)
		if within(dirs, s.Path, p) {
			out[s.Slot] = held{}
			continue
		}
		var h held
		there, st, err := orig.inTree(p)
		if err != nil {
			return nil, err
		}
		h.there, h.st = there, st
		if there && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if h.beneath, err = walkBeneath(orig, p); err != nil {
				return nil, err
			}
			dirs[s.Path] = p
		}
		out[s.Slot] = h
	}
	return out, nil
}

// within reports whether the object at original path o, detached at
// final path p, is beneath a directory of dirs: one at an ancestor of p
// whose original path is the same ancestor of o (no rename between).
func within(dirs map[string]string, p, o string) bool {
	for i := strings.LastIndexByte(p, '/'); i > 0; i = strings.LastIndexByte(p[:i], '/') {
		if a, ok := dirs[p[:i]]; ok && layers.Join(a, p[i+1:]) == o {
			return true
		}
	}
	return false
}

// backedUpFrom is the original path of the object a detach at the final
// path p finds: what the original has under p's name in p's directory
// (a renamed directory's new path holds what the original has there,
// not the directory).
func backedUpFrom(r renames, p string) string {
	dir, name := layers.Split(p)
	return layers.Join(r.original(dir), name)
}

// changedSince returns the path, relative to the backed-up object, of
// the first thing t holds at rel that is not what h records, with the
// reason; "", "" when nothing changed. Objects gone are no change (the
// apply moves renamed directories out first; what another writer took
// away is not lost).
func (h held) changedSince(t *tree, rel string) (string, string, error) {
	st, err := t.lstat(rel)
	if errors.Is(err, unix.ENOENT) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	if reason := h.topChange(&st); reason != "" || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", reason, nil
	}
	now, err := walkBeneath(t, rel)
	if err != nil {
		return "", "", err
	}
	var first, why string
	for p, st := range now {
		was, ok := h.beneath[p]
		reason := ""
		switch {
		case !ok:
			reason = madeDuringCommit
		case st.Mode&unix.S_IFMT == unix.S_IFDIR && was.Mode&unix.S_IFMT == unix.S_IFDIR:
			if st.Ino != was.Ino {
				reason = changedDuringCommit
			}
		case !sameState(&was, &st):
			reason = changedDuringCommit
		}
		if reason != "" && (first == "" || p < first) {
			first, why = p, reason
		}
	}
	return first, why, nil
}

// topChange says how now is not the object h records at the top ("": it
// is): for a directory, another inode (its entries are compared one by
// one), for anything else another state.
func (h held) topChange(now *unix.Stat_t) string {
	switch {
	case !h.there:
		return madeDuringCommit
	case now.Mode&unix.S_IFMT == unix.S_IFDIR && h.st.Mode&unix.S_IFMT == unix.S_IFDIR:
		if now.Ino != h.st.Ino {
			return changedDuringCommit
		}
	case !sameState(&h.st, now):
		return changedDuringCommit
	}
	return ""
}

const madeDuringCommit = "made in the original during the commit"

// walkBeneath returns every object beneath the directory rel of t, by
// path relative to rel, never following a symlink. What goes away while
// it reads is left out.
func walkBeneath(t *tree, rel string) (map[string]unix.Stat_t, error) {
	var fd int
	var err error
	if rel == "" {
		fd, err = unix.Openat(t.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	} else {
		fd, err = fsutil.OpenBeneath(t.fd, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return nil, err
	}
	out := map[string]unix.Stat_t{}
	return out, walkDir(fd, "", out)
}

// walkDir adds what the directory fd holds to out, by prefix + name, and
// closes fd.
func walkDir(fd int, prefix string, out map[string]unix.Stat_t) error {
	f := os.NewFile(uintptr(fd), prefix)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
			continue
		} else if err != nil {
			return err
		}
		p := path.Join(prefix, n)
		out[p] = st
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // gone or replaced since the fstatat
		} else if err != nil {
			return err
		}
		if err := walkDir(sub, p, out); err != nil {
			return err
		}
	}
	return nil
}
