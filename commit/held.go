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
	st    objState
	// beneath is, for a directory, every object beneath it by its path
	// relative to the directory.
	beneath map[string]objState
}

// objState is what the commit compares of an object: which one it is,
// and what a write, a chmod, a chown or an attribute set moves (the
// ctime, for the last two). Under half a unix.Stat_t, for a directory
// of a million entries removed.
type objState struct {
	dev, ino   uint64
	mode       uint32
	size       int64
	mtim, ctim unix.Timespec
}

func stateOf(st *unix.Stat_t) objState {
	return objState{dev: st.Dev, ino: st.Ino, mode: st.Mode, size: st.Size, mtim: st.Mtim, ctim: st.Ctim}
}

// inode names an object across the originals of a plan.
type inode struct{ dev, ino uint64 }

func (s objState) inode() inode { return inode{s.dev, s.ino} }

func (s objState) isDir() bool { return s.mode&unix.S_IFMT == unix.S_IFDIR }

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
	gone := map[string]bool{}   // final paths whose object goes to the backups
	for _, s := range steps {
		if s.Kind == opInstall || s.Kind == opMkdir || s.Kind == opAttach {
			ours[s.Path] = true
		}
		if s.Kind == opDetach && strings.HasPrefix(s.Slot, "b/") {
			gone[s.Path] = true
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
		there, st, err := orig.exists(p)
		if errors.Is(err, unix.ELOOP) {
			if symlinkGoes(orig, p, gone, r) {
				// Beneath a symlink of the original the commit takes
				// away (the sandbox put a directory there): nothing.
				out[key] = held{}
				continue
			}
			// The original changing under the check (a directory
			// swapped for a symlink for a moment): what the apply
			// would back up there is unknown, and would go unchecked.
			return nil, conflictAt(StagePrepare, s.Path, ReasonChangedWhileRead)
		}
		if err != nil {
			return nil, err
		}
		h.there, h.st = there, stateOf(&st)
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

// symlinkGoes reports whether the first symlink on the way to the
// original path p is an object the commit moves into the backups (at
// its path once the renamed directories are in place).
func symlinkGoes(orig *tree, p string, gone map[string]bool, r renames) bool {
	q := orig.firstSymlink(p)
	return q != "" && gone[r.final(q)]
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

// ownState is the state the apply's own steps left on original inodes
// (moved into the backups, given the sandbox's metadata): what to expect
// of them since, rather than what the check saw. A hard link of the
// original shows one inode at several paths; the sandboxes of a plan
// share one ownState (Options.Applied), as their originals may share
// inodes.
type ownState map[inode]objState

// note records what t has at rel now as the apply's own doing.
func (o ownState) note(t *tree, rel string) error {
	st, err := t.lstat(rel)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		o[inode{st.Dev, st.Ino}] = stateOf(&st)
	}
	return err
}

// noted reports whether the apply's own steps changed the inode of st.
func (o ownState) noted(st *unix.Stat_t) bool {
	_, ok := o[inode{st.Dev, st.Ino}]
	return ok
}

// expect is the state to expect of the object the check saw as s.
func (o ownState) expect(s objState) objState {
	if own, ok := o[s.inode()]; ok {
		return own
	}
	return s
}

// Applied is what the applies of several transactions did to their
// originals' inodes. The transactions of one plan share one (see
// Options.Applied): an original file hard-linked into another original
// of the plan is changed by one apply and looked at by another.
type Applied struct{ own ownState }

// NewApplied returns an empty Applied.
func NewApplied() *Applied { return &Applied{own: ownState{}} }

// untouched reports whether st, an object the apply moved, is as the
// apply left it. Without a record (a directory, whose entries are
// checked on their own, or an undo after a crash, which has none) it is
// taken to be.
func (o ownState) untouched(s objState) bool {
	own, ok := o[s.inode()]
	return !ok || unchanged(own, s)
}

// applied reports whether the apply's own steps changed the non-directory
// st (whose ctime then moved), or cannot tell (an undo after a crash).
func (o ownState) applied(s objState) bool {
	if o == nil || s.isDir() {
		return true
	}
	_, ok := o[s.inode()]
	return ok
}

// unchanged reports whether now is the object was describes, untouched:
// for a directory the same inode (its entries are compared one by one:
// the apply moves some out), for anything else also the same mode, size,
// mtime and ctime (an attribute or owner set moves only the ctime).
func unchanged(was, now objState) bool {
	if was.isDir() && now.isDir() {
		return was.ino == now.ino
	}
	return was == now
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
	if reason := h.topChange(own, stateOf(&st)); reason != "" || st.Mode&unix.S_IFMT != unix.S_IFDIR {
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
		} else if !unchanged(own.expect(was), st) {
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
func (h held) topChange(own ownState, now objState) string {
	switch {
	case !h.there:
		return madeDuringCommit
	case !unchanged(own.expect(h.st), now):
		return changedDuringCommit
	}
	return ""
}

const madeDuringCommit = "made in the original during the commit"

// walkBeneath returns every object beneath the directory rel of t, by
// path relative to rel, never following a symlink. What goes away while
// it reads is left out.
func walkBeneath(t *tree, rel string) (map[string]objState, error) {
	fd, err := t.openDir(rel)
	if err != nil {
		return nil, err
	}
	out := map[string]objState{}
	return out, walkDir(fd, "", out)
}

// walkDir adds what the directory fd holds to out, by prefix + name, and
// closes fd.
func walkDir(fd int, prefix string, out map[string]objState) error {
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
		out[p] = stateOf(&st)
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
