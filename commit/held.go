package commit

import (
	"errors"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// held is what the original held, right after the conflict check, at a
// path the apply moves into the backups or changes the metadata of:
// nothing, a non-directory, or a directory with everything beneath it.
// The backups go at the commit point, so the apply and Sync refuse to
// back up anything else: a write, an attribute or a new entry made since
// would be lost with them; and the apply refuses to set the sandbox's
// metadata over someone else's.
type held struct {
	there bool
	st    unix.Stat_t
	// beneath is, for a directory, every object beneath it by its path
	// relative to the directory.
	beneath map[string]unix.Stat_t
}

// heldObjects records what the original holds at the path of each step
// that moves an object into the backups (by the step's slot) or sets the
// metadata of an original object in place (by metaKey; not one the
// commit puts there). Beneath a
// directory recorded whole, whose detach comes first and takes what is
// beneath it, a later detach must find nothing.
func heldObjects(orig *tree, steps []step, r renames) (map[string]held, error) {
	out := map[string]held{}
	dirs := map[string]string{} // final path -> original path, of directories recorded whole
	ours := map[string]bool{}   // final paths the commit puts an object at
	for _, s := range steps {
		if s.Kind == opInstall || s.Kind == opMkdir || s.Kind == opAttach {
			ours[s.Path] = true
		}
	}
	for _, s := range steps {
		var key, p string
		switch {
		case s.Kind == opDetach && strings.HasPrefix(s.Slot, "b/"):
			var there bool
			key = s.Slot
			if p, there = r.replacedAt(s.Path); !there || within(dirs, s.Path, p) {
				// The original's object at p is elsewhere by then, or
				// goes with a directory detached before: nothing must be
				// there.
				out[key] = held{}
				continue
			}
		case s.Kind == opMeta && !ours[s.Path]:
			key, p = metaKey(s.Path), r.original(s.Path)
		default:
			continue
		}
		var h held
		there, st, err := orig.inTree(p)
		if err != nil {
			return nil, err
		}
		h.there, h.st = there, st
		if there && st.Mode&unix.S_IFMT == unix.S_IFDIR && s.Kind == opDetach {
			if h.beneath, err = walkBeneath(orig, p); err != nil {
				return nil, err
			}
			dirs[s.Path] = p
		}
		out[key] = h
	}
	return out, nil
}

func metaKey(p string) string { return "meta:" + p }

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

// ownState is the state the apply's own steps left on original inodes
// (moved into the backups, given the sandbox's metadata): what to expect
// of them since, rather than what the check saw. A hard link of the
// original shows one inode at several paths.
type ownState map[uint64]unix.Stat_t

// note records what t has at rel now as the apply's own doing.
func (o ownState) note(t *tree, rel string) error {
	st, err := t.lstat(rel)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		o[st.Ino] = st
	}
	return err
}

// expect is the state to expect of the object the check saw as st.
func (o ownState) expect(st *unix.Stat_t) *unix.Stat_t {
	if own, ok := o[st.Ino]; ok {
		return &own
	}
	return st
}

// untouched reports whether st, an object the apply moved, is as the
// apply left it. Without a record (a directory, whose entries are
// checked on their own, or an undo after a crash, which has none) it is
// taken to be.
func (o ownState) untouched(st *unix.Stat_t) bool {
	own, ok := o[st.Ino]
	return !ok || unchanged(&own, st)
}

// applied reports whether the apply's own steps changed the non-directory
// st (whose ctime then moved), or cannot tell (an undo after a crash).
func (o ownState) applied(st *unix.Stat_t) bool {
	if o == nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return true
	}
	_, ok := o[st.Ino]
	return ok
}

// unchanged reports whether now is the object was describes, untouched:
// for a directory the same inode (its entries are compared one by one:
// the apply moves some out), for anything else also the same mode, size,
// mtime and ctime (an attribute or owner set moves only the ctime).
func unchanged(was, now *unix.Stat_t) bool {
	if was.Mode&unix.S_IFMT == unix.S_IFDIR && now.Mode&unix.S_IFMT == unix.S_IFDIR {
		return was.Ino == now.Ino
	}
	return sameState(was, now) && was.Ctim == now.Ctim
}

// changedSince returns the path, relative to the backed-up object, of
// the first thing t holds at rel that is not what h records (or what the
// apply itself left there: own), with the reason; "", "" when nothing
// changed. Objects gone are no change (the apply moves renamed
// directories out first; what another writer took away is not lost).
func (h held) changedSince(t *tree, rel string, own ownState) (string, string, error) {
	st, err := t.lstat(rel)
	if errors.Is(err, unix.ENOENT) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	if reason := h.topChange(own, &st); reason != "" || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", reason, nil
	}
	now, err := walkBeneath(t, rel)
	if err != nil {
		return "", "", err
	}
	var first, why string
	for p, st := range now {
		reason := ""
		if was, ok := h.beneath[p]; !ok {
			reason = madeDuringCommit
		} else if !unchanged(own.expect(&was), &st) {
			reason = changedDuringCommit
		}
		if reason != "" && (first == "" || p < first) {
			first, why = p, reason
		}
	}
	return first, why, nil
}

// topChange says how now is not the object h records at the top ("": it
// is, or what the apply's own steps made of it).
func (h held) topChange(own ownState, now *unix.Stat_t) string {
	switch {
	case !h.there:
		return madeDuringCommit
	case !unchanged(own.expect(&h.st), now):
		return changedDuringCommit
	}
	return ""
}

const madeDuringCommit = "made in the original during the commit"

// walkBeneath returns every object beneath the directory rel of t, by
// path relative to rel, never following a symlink. What goes away while
// it reads is left out.
func walkBeneath(t *tree, rel string) (map[string]unix.Stat_t, error) {
	fd, err := t.openDir(rel)
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
