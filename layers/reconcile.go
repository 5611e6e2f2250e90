package layers

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// After an unclean stop the journal may name less than the upper holds.
//
// A record is written before its operation, so a crash of the server
// leaves a journal that names every change the upper holds (and perhaps
// one it does not: the change set reads the upper for every path): what
// it wrote is in the page cache, which outlives the process. A power cut
// (or a filesystem shut down and mounted again) is another matter: the upper's own changes (a rename, a
// mkdir, a whiteout, a copy-up) become durable with any commit of its
// filesystem's journal, which another process's fsync forces, while the
// records are durable only once Journal.Sync ran (every 200 ms, or an
// fsync through the mount). A power cut between the two leaves changes
// in the upper whose records came back as a torn tail and were cut:
// the mount showed them, while status and commit did not, and a commit
// dropped them (found by a power-cut probe on 2026-11-28).
//
// So a server leaves a mark beside the journal (journal.server: the
// boot, its pid and start time, the mount the journal is reached
// through) while it serves, written and synced before it changes
// anything, removed once it closed the journal cleanly. A mark whose
// process is gone on this boot, with the journal's mount the same, says
// the process crashed: the journal is whole. Otherwise a mark whose
// process is gone says records may have been lost: the journal is
// reconciled with the upper (reconcile), by a one-time walk of the upper
// that names what the journal does not. (Until 2026-11-28 a crash was
// reconciled too: the walk, which cannot tell a lost change of the
// sandbox's from one the original made since, then turned the
// original's chmod of a directory the sandbox had only written in into
// a conflict: TestCrashWithAWholeJournalWhileTheOriginalChanges.) A server opening the
// sandbox appends those records before it serves; a reader (status,
// diff, commit of an unmounted sandbox) adds them to what it read
// without writing them.

// serverMarkSuffix names the server mark beside the journal.
const serverMarkSuffix = ".server"

// serverMark is what a server's mark holds: this boot, the process and
// when it started (a pid alone is used again), and mount, the mount the
// journal is reached through (mountID; "-" for none: a crash is then
// taken for a loss of records).
func serverMark(mount string) []byte {
	start, _ := fsutil.ProcessStart(os.Getpid())
	return fmt.Appendf(nil, "v2 %s %d %d %s\n", bootID(), os.Getpid(), start, mount)
}

// mountID is fsutil.UniqueMountID as a mark writes it.
func mountID(path string) string {
	if id, ok := fsutil.UniqueMountID(path); ok {
		return strconv.FormatUint(id, 10)
	}
	return "-"
}

// bootID is fsutil.BootID, "-" where it cannot be read (a mark keeps
// its four fields).
func bootID() string {
	if b := fsutil.BootID(); b != "" {
		return b
	}
	return "-"
}

// writeServerMark marks the sandbox as served by this process, durably:
// the mark must be on disk before any change of the upper is.
func (l *Layers) writeServerMark() error {
	if err := fsutil.WriteFileAtomic(l.mark, serverMark(mountID(l.journalPath)), 0o600); err != nil {
		return fmt.Errorf("mark the sandbox as served: %w", err)
	}
	l.journal.OnDoubt(l.markRecordsInDoubt)
	return nil
}

// markRecordsInDoubt marks the sandbox as served without naming the
// journal's mount: once the journal cannot say it holds every record
// appended (a failed fdatasync may have dropped its pages, with no
// remount to tell), a crash of this server is taken for a loss, and the
// next open walks the upper (found by a review on 2026-11-28). A failure
// here leaves the mark as it was.
func (l *Layers) markRecordsInDoubt() {
	_ = fsutil.WriteFileAtomic(l.mark, serverMark("-"), 0o600)
}

// removeServerMark says the journal names all the upper holds: the
// server closed it (synced) and changes nothing more. Not synced: a mark
// left by a power cut only costs the next open a walk of the upper.
func (l *Layers) removeServerMark() error {
	if err := os.Remove(l.mark); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the server mark: %w", err)
	}
	return nil
}

// A lastStop is how the last server of a sandbox stopped, as its mark
// tells.
type lastStop int

const (
	// stoppedCleanly: no mark. The last server closed the journal (or
	// none ran).
	stoppedCleanly lastStop = iota
	// serving: the mark's server is alive.
	serving
	// crashed: its process ended on this boot, and the journal is
	// reached through the mount it was: every record it wrote is there,
	// before the operation it names.
	crashed
	// lostRecords: it ended otherwise (another boot, the journal's
	// filesystem mounted again, or a mark that does not read): the
	// upper may hold changes whose records were lost.
	lostRecords
)

// serverStop reads the server mark at path, beside the journal at
// journal.
func serverStop(path, journal string) (lastStop, error) {
	return markStop(path, journal, true)
}

// markStop is serverStop; lockCounts false for a caller that holds the
// journal's lock itself (Open: no other server can be serving).
func markStop(path, journal string, lockCounts bool) (lastStop, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return stoppedCleanly, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the server mark: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 256))
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("read the server mark %q: %w", path, err)
	}
	// v1 (written until 2026-11-28) has no mount: a crash it names is
	// taken for a loss.
	fs := strings.Fields(string(b))
	if !(len(fs) == 4 && fs[0] == "v1" || len(fs) == 5 && fs[0] == "v2") || fs[1] != bootID() || fs[1] == "-" {
		return lostRecords, nil
	}
	pid, err1 := strconv.Atoi(fs[2])
	start, err2 := strconv.ParseUint(fs[3], 10, 64)
	if err1 != nil || err2 != nil {
		return lostRecords, nil
	}
	if now, alive := fsutil.ProcessStart(pid); alive && now == start {
		return serving, nil
	}
	// A server in another pid namespace is not found by its pid: its
	// lock on the journal (Journal.load) says it serves.
	if lockCounts {
		if held, err := fsutil.LockedElsewhere(journal); err == nil && held {
			return serving, nil
		}
	}
	if len(fs) == 5 && fs[4] != "-" && fs[4] == mountID(journal) {
		return crashed, nil
	}
	return lostRecords, nil
}

// Records returns the records of cfg's journal as the change set reads
// them: after an unclean stop of its last server, with those that
// reconcile it with the upper added (not written: the next mount writes
// them). A commit reads its bases from them.
func Records(cfg Config) ([]Record, error) {
	l, err := newLayers(cfg)
	if err != nil {
		return nil, err
	}
	defer l.closeLowerRoots()
	return l.readRecords()
}

// readRecords is Records with this stack.
func (l *Layers) readRecords() ([]Record, error) {
	recs, err := ReadJournal(l.journalPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	stop, err := serverStop(l.mark, l.journalPath)
	if err != nil || stop != lostRecords {
		return recs, err
	}
	more, err := l.reconcile(recs)
	if err != nil {
		return nil, fmt.Errorf("reconcile the journal with the upper after an unclean stop: %w", err)
	}
	return append(recs, more...), nil
}

// reconcileOpened appends to the opened journal the records reconcile
// gives, when the last server stopped uncleanly, and syncs them. It
// returns how many.
func (l *Layers) reconcileOpened() (int, error) {
	stop, err := markStop(l.mark, l.journalPath, false)
	if err != nil || stop != lostRecords {
		return 0, err
	}
	recs, err := l.journal.Records()
	if err != nil {
		return 0, err
	}
	more, err := l.reconcile(recs)
	if err != nil {
		return 0, fmt.Errorf("reconcile the journal with the upper after an unclean stop: %w", err)
	}
	for _, r := range more {
		if err := l.journal.Append(r); err != nil {
			return 0, err
		}
	}
	return len(more), l.journal.Sync()
}

// reconcile returns the records that make the journal recs name what
// the upper holds, as the operations whose records were lost would have
// (they came after every record left: the journal is cut at its tail):
//
//   - a directory whose redirect or parent's lineage, or a file whose
//     origin, names an original object the replay has elsewhere: a
//     rename (aside first, then into place: move), or a hard link where
//     another name of the same upper inode is where the replay has it;
//   - a whiteout at a path no record names: the removal of the
//     original's object;
//   - an object at a path no record names: made (create, mkdir, mknod,
//     symlink, link) where the original has nothing, else written (its
//     metadata too: the change set compares it all); a directory that
//     merges no directory of the original where the replay has the
//     original's object: made (mkdir), so what lies beneath is new;
//   - a file a record names without a content change: written.
//
// With them go the bases of the original's objects the upper copies or
// replaces, and of everything beneath an original directory it removes
// or replaces (a commit checks each): only for an object the original
// last changed before the upper object was made (baseFor), so that a
// change the original made since is a conflict, never overwritten.
//
// The change set reads the upper for every path the journal names, so
// naming a path too many costs a lookup, never a wrong change; naming
// one too few drops a change. An object the upper holds at a path the
// journal already names needs nothing more (a removal or rename whose
// record survived while its operation did not shows as it is).
func (l *Layers) reconcile(recs []Record) ([]Record, error) {
	rc := &reconciler{l: l, t: replay(recs), at: now(), inos: map[uint64]string{},
		pending: map[string]string{}, movedIno: map[uint64]string{}}
	// Renames first: what lies beneath a moved directory is then found
	// through its new lineage.
	if err := rc.walk("", rc.moved); err != nil {
		return nil, err
	}
	if err := rc.move(); err != nil {
		return nil, err
	}
	if err := rc.named(""); err != nil {
		return nil, err
	}
	if err := rc.walk("", rc.named); err != nil {
		return nil, err
	}
	return rc.out, nil
}

type reconciler struct {
	l   *Layers
	t   *touched
	at  time.Time
	out []Record
	// inos holds the first path of each upper non-directory with more
	// than one link, by inode number: the other names are links to it.
	inos map[uint64]string
	// moves are the renames the walk found lost, top down: each upper
	// path and the original path its object came from (pending); links
	// the names of a moved object's inode after its first (movedIno).
	moves    []lostMove
	pending  map[string]string
	movedIno map[uint64]string
}

// lostMove is a rename (or, with link, a hard link to the object moved
// to link) whose record was lost: the object of the original path from
// is at path in the upper.
type lostMove struct {
	path, from, link string
	ino              uint64 // of a non-directory with links, else 0
}

// emit adds a record and replays it.
func (rc *reconciler) emit(op Op, path, path2 string, flags uint32) {
	rc.out = append(rc.out, Record{Op: op, Time: rc.at, Flags: flags, Path: path, Path2: path2})
	rc.t.apply(&rc.out[len(rc.out)-1])
}

// walk calls f for every entry of the upper beneath dir, a directory
// before what it holds, names in order.
func (rc *reconciler) walk(dir string, f func(p string) error) error {
	fd, err := rc.l.OpenUpperRaw(dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("upper %q: %w", dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("upper %q: %w", dir, err)
	}
	slices.Sort(names)
	for _, n := range names {
		p := Join(dir, n)
		if err := f(p); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := rc.l.upperLstat(p, &st); err != nil {
			return fmt.Errorf("upper %q: %w", p, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if err := rc.walk(p, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// cameFrom returns the original path the upper object at p says it came
// from: the original directory a directory merges (its redirect, or its
// parent's and its name), a copied-up file's origin. ok is false for an
// object that says nothing (made by the sandbox, a directory merging no
// directory of the original, a whiteout).
func (rc *reconciler) cameFrom(p string, st *unix.Stat_t) (from string, ok bool) {
	_ = rc.l.UpperDo(p, func(up string) error {
		switch {
		case fsutil.IsWhiteout(st):
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			// Its redirect, or its parent's and its name; a directory
			// that merges no directory of the original says nothing.
			if from, ok = rc.l.lowerPathOf(p); ok {
				lo, there, err := rc.l.resolveLower(from)
				ok = err == nil && there && lo.isDir()
			}
		default:
			var o origin
			if o, ok = rc.l.readOrigin(up); ok {
				from = o.path
			}
		}
		return nil
	})
	return from, ok
}

// redirectedFromGone returns the original path a directory's redirect
// names (a rename of an original directory sets it) where the original
// no longer has a directory there: another writer removed or moved it
// after the sandbox's rename, whose record was lost. The rename is
// noted all the same, with a base that fails (move), so that a commit
// refuses as with the whole journal, instead of making the directory
// anew (found by a random test of power cuts with another writer,
// 2026-11-28).
func (rc *reconciler) redirectedFromGone(p string, st *unix.Stat_t) (string, bool) {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", false
	}
	var r string
	_ = rc.l.UpperDo(p, func(up string) error { r = rc.l.redirectOf(up); return nil })
	from, ok := strings.CutPrefix(r, "/")
	if !ok {
		return "", false
	}
	lo, there, err := rc.l.resolveLower(from)
	if err != nil || (there && lo.isDir()) {
		return "", false
	}
	return from, true
}

// moved notes the rename (or link) that brought the upper object at p
// there, when its own attributes say it came from an original object
// that neither the replay nor a rename noted above p puts there.
func (rc *reconciler) moved(p string) error {
	var st unix.Stat_t
	if err := rc.l.upperLstat(p, &st); err != nil {
		return fmt.Errorf("upper %q: %w", p, err)
	}
	from, ok := rc.cameFrom(p, &st)
	if !ok {
		if from, ok = rc.redirectedFromGone(p, &st); !ok {
			return nil
		}
	}
	if x, made := rc.expected(p); !made && x == from && !rc.movedBack(p, from, &st) {
		return nil
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
		if q, ok := rc.movedIno[st.Ino]; ok {
			rc.moves = append(rc.moves, lostMove{path: p, from: from, link: q})
			return nil
		}
		rc.movedIno[st.Ino] = p
		rc.moves = append(rc.moves, lostMove{path: p, from: from, ino: st.Ino})
		return nil
	}
	rc.pending[p] = from
	rc.moves = append(rc.moves, lostMove{path: p, from: from})
	return nil
}

// movedBack reports whether the object at p, which is where its lineage
// puts it, came back there by a rename whose record was lost: the replay
// has the original's object from elsewhere than at p (mv d e recorded,
// mv e d lost), or, beneath a rename noted above p, elsewhere than
// beneath the object that rename moves (mv a/y a/b/y recorded, mv a/b/y
// a/y and mv a b lost). Not for a file with links: a stale lineage of a
// removed name may lead to another of them.
func (rc *reconciler) movedBack(p, from string, st *unix.Stat_t) bool {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
		return false
	}
	want := p
	for a := p; a != ""; {
		if a, _ = Split(a); a == "" {
			break
		}
		if fa, ok := rc.pending[a]; ok {
			want = rc.locate(fa) + p[len(a):]
			break
		}
	}
	return rc.locate(from) != want
}

// expected is the original path the object at p comes from as the
// replay and the renames noted above p have it, and whether the replay
// has an object the sandbox made there instead.
func (rc *reconciler) expected(p string) (string, bool) {
	for a := p; ; {
		if x, ok := rc.pending[a]; ok {
			return x + p[len(a):], false
		}
		if a == "" {
			break
		}
		a, _ = Split(a)
	}
	x := rc.t.counterpartHere(p)
	return x, strings.HasPrefix(x, madeHere)
}

// move emits the lost renames: each object first to a name of its own
// that nothing uses, then, top down, to where the upper has it, so that
// no rename lands on an object another is still to take away (the
// order they were made in is lost: a swap needs the detour).
func (rc *reconciler) move() error {
	if len(rc.moves) == 0 {
		return nil
	}
	// A file with links whose object another name has where the
	// replay (and the renames noted) put it was linked, not moved.
	names := map[uint64][]string{}
	for _, m := range rc.moves {
		if m.ino != 0 {
			names[m.ino] = nil
		}
	}
	if len(names) > 0 {
		if err := rc.walk("", func(p string) error {
			var st unix.Stat_t
			if rc.l.upperLstat(p, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				if _, ok := names[st.Ino]; ok {
					names[st.Ino] = append(names[st.Ino], p)
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	for i, m := range rc.moves {
		for _, q := range names[m.ino] {
			if x, made := rc.expected(q); q != m.path && !made && x == m.from {
				rc.moves[i].link = q
				break
			}
		}
	}
	// A moved or linked object whose original the original no longer
	// has (another writer removed or moved it since): its base fails
	// (found by a random test of power cuts with another writer,
	// 2026-11-28: the commit made the object again).
	for _, m := range rc.moves {
		if _, ok, err := rc.l.resolveLower(m.from); err != nil {
			return err
		} else if !ok {
			var st unix.Stat_t
			if err := rc.l.upperLstat(m.path, &st); err != nil {
				return fmt.Errorf("upper %q: %w", m.path, err)
			}
			if err := rc.goneBase(m.from, m.path, &st); err != nil {
				return err
			}
		}
	}
	aside := make([]string, len(rc.moves))
	for i, m := range rc.moves {
		if m.link != "" {
			continue
		}
		src := rc.locate(m.from)
		if lo, ok, err := rc.l.resolveLower(m.from); err != nil {
			return err
		} else if ok {
			if err := rc.baseFor(m.path, lo, false); err != nil {
				return err
			}
		}
		var st, sst unix.Stat_t
		if rc.l.upperLstat(m.path, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 &&
			rc.l.upperLstat(src, &sst) == nil && sst.Ino == st.Ino && src != m.path {
			rc.moves[i].link = src // linked to a name it still has
			continue
		}
		if src == "" {
			continue // the root moves nowhere
		}
		aside[i] = rc.asideName(i)
		rc.emit(OpRename, src, aside[i], 0)
	}
	for i, m := range rc.moves {
		switch {
		case m.link != "":
			rc.emit(OpLink, m.path, m.link, 0)
		case aside[i] != "":
			// What the original has in its place went when it came:
			// a rename over an object records that object's base.
			if err := rc.replacedBase(m.path, m.from); err != nil {
				return err
			}
			rc.emit(OpRename, aside[i], m.path, 0)
		}
	}
	return nil
}

// movedInBase records the bases of the original objects the replay had
// moved beneath p, which went with what p held (mv --exchange c a/c2,
// then rm -r a: c's entries went too, and a commit checks each).
func (rc *reconciler) movedInBase(p string) error {
	var under []string
	for q := range rc.t.from {
		if strings.HasPrefix(q, p+"/") && !strings.HasPrefix(rc.t.from[q], madeHere) {
			under = append(under, q)
		}
	}
	if len(under) == 0 {
		return nil
	}
	slices.Sort(under)
	born, err := rc.bornOf(p)
	if err != nil {
		return err
	}
	for _, q := range under {
		hit, ok, err := rc.l.resolveLower(rc.t.from[q])
		if err != nil {
			return err
		}
		if ok {
			if err := rc.base(hit, true, born, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// bornOf is when the upper object at p was made (ns): its birth time,
// or changedSince where the filesystem keeps none.
func (rc *reconciler) bornOf(p string) (int64, error) {
	var stx unix.Statx_t
	err := rc.l.UpperDo(p, func(up string) error {
		return unix.Statx(unix.AT_FDCWD, up, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME|unix.STATX_CTIME, &stx)
	})
	if err != nil {
		return 0, fmt.Errorf("upper %q: %w", p, err)
	}
	if stx.Mask&unix.STATX_BTIME != 0 {
		return stx.Btime.Sec*1e9 + int64(stx.Btime.Nsec), nil
	}
	// No birth time: the ctime moves with every later change of the
	// upper object, and would take an original changed in between for
	// what the sandbox saw. Every original counts as changed since.
	return changedSince, nil
}

// changedSince is a time before every original's ctime: a base taken
// against it matches nothing (base).
const changedSince = 0

// replacedBase records the base of the original's object in the place
// of p, where the object of the original path from moved (and of what
// it holds: it went whole), taken for what the sandbox saw when it was
// last changed before the upper object at p was made.
func (rc *reconciler) replacedBase(p, from string) error {
	lo, ok, err := rc.l.lowerInPlace(nil, p)
	if err != nil || !ok || lo.origin.Path == from {
		return err
	}
	// The rename came after the moved object was made: its birth is
	// the latest time known to be before it. (Its ctime, taken until
	// 2026-11-28, moves with any later change of it, past a change the
	// original made after the rename: TestLostRenameOverAnOriginalChangedSince.)
	born, err := rc.bornOf(p)
	if err != nil {
		return err
	}
	return rc.base(lo, true, born, 0)
}

// asideName is a name at the root for the i-th lost rename's detour that
// no record names and neither the upper nor the original holds.
func (rc *reconciler) asideName(i int) string {
	for n := ".sbxfs-lost-rename-" + strconv.Itoa(i); ; n += "_" {
		var st unix.Stat_t
		if !rc.t.unnamed(n) || rc.l.upperLstat(n, &st) == nil {
			continue
		}
		if _, ok, err := rc.l.resolveLower(n); err == nil && !ok {
			return n
		}
	}
}

// locate returns the path at which the replay has the original's object
// x now: where a rename took it, or a directory above it; x itself when
// none did.
func (rc *reconciler) locate(x string) string {
	for a := x; ; {
		var at []string
		for q, f := range rc.t.from {
			if f == a && !rc.t.made[q] {
				at = append(at, q)
			}
		}
		if len(at) > 0 {
			slices.Sort(at) // one answer, whatever the map's order
			return at[0] + x[len(a):]
		}
		if a == "" {
			return x
		}
		a, _ = Split(a)
	}
}

// named names the upper object at p where the journal does not (or
// names a file's content unchanged), and records the bases of what it
// copies or replaces.
func (rc *reconciler) named(p string) error {
	var st unix.Stat_t
	if err := rc.l.upperLstat(p, &st); err != nil {
		return fmt.Errorf("upper %q: %w", p, err)
	}
	unnamed := rc.t.unnamed(p)
	typ := st.Mode & unix.S_IFMT
	whiteout := fsutil.IsWhiteout(&st)
	var first string // another name of the same upper file
	if typ != unix.S_IFDIR && st.Nlink > 1 && !whiteout {
		if q, ok := rc.inos[st.Ino]; ok {
			first = q
		} else {
			rc.inos[st.Ino] = p
		}
	}
	if p == "" {
		if unnamed && rc.attrsDiffer(p, nil) {
			// Its base too: the one the first open wrote may be among
			// the records lost, and a change without a base is no
			// conflict.
			root := &lowerHit{}
			if err := unix.Lstat(rc.l.lowers[0], &root.st); err != nil {
				return fmt.Errorf("original %q: %w", rc.l.lowers[0], err)
			}
			if err := rc.baseFor("", root, false); err != nil {
				return err
			}
			rc.emit(OpSetattr, "", "", AttrMode|AttrOwner)
		}
		return nil
	}
	// The original's object in p's place, which an object the sandbox
	// made there has not.
	lo, _, err := rc.l.resolveLower(rc.t.counterpartHere(p))
	if err != nil {
		return err
	}
	opaque := typ == unix.S_IFDIR && rc.l.upperOpaque(p)
	if lo == nil && !whiteout && !opaque {
		gone, err := rc.copyOfGone(p, &st)
		if err != nil || gone && unnamed {
			return err
		}
	}
	_, merges := rc.cameFrom(p, &st)
	mergesNothing := typ == unix.S_IFDIR && !merges
	if lo != nil {
		// A directory of the original removed or replaced goes with
		// its entries: a commit checks each was as the sandbox saw it.
		takesAway := lo.isDir() && (whiteout || mergesNothing || typ != unix.S_IFDIR)
		if err := rc.baseFor(p, lo, takesAway); err != nil {
			return err
		}
	}
	if whiteout || mergesNothing || typ != unix.S_IFDIR {
		if err := rc.movedInBase(p); err != nil {
			return err
		}
		// What the original has in p's place went too, where p's
		// lineage leads elsewhere (a rename over it, a removal of what
		// a rename brought).
		in, ok, err := rc.l.lowerInPlace(nil, p)
		if err != nil {
			return err
		}
		if ok && (lo == nil || in.origin.Path != lo.origin.Path) {
			born, err := rc.bornOf(p)
			if err != nil {
				return err
			}
			if err := rc.base(in, true, born, 0); err != nil {
				return err
			}
		}
	}
	switch {
	case !unnamed && mergesNothing && lo != nil:
		// The replay has the original's object here, the upper a new
		// directory (removed and made again): what lies beneath is new.
		rc.emit(OpMkdir, p, "", 0)
	case !unnamed:
		if typ == unix.S_IFREG && !rc.t.paths[p] {
			rc.emit(OpWrite, p, "", 0) // its content may have changed since
		}
	case first != "":
		rc.emit(OpLink, p, first, 0)
	case whiteout:
		switch {
		case lo == nil: // nothing of the original's to hide
		case lo.isDir():
			rc.emit(OpRmdir, p, "", 0)
		default:
			rc.emit(OpUnlink, p, "", 0)
		}
	case typ == unix.S_IFDIR:
		switch {
		case lo == nil || opaque || !lo.isDir():
			rc.emit(OpMkdir, p, "", 0)
		case rc.attrsDiffer(p, lo):
			rc.emit(OpSetattr, p, "", AttrMode|AttrOwner)
		}
	case lo == nil:
		rc.emit(madeBy(typ), p, "", 0)
	default:
		rc.emit(OpWrite, p, "", 0)
	}
	return nil
}

// attrsDiffer reports whether the upper directory at p differs from lo,
// the original's directory it copies (nil: the root, p ""), in its own
// attributes (mode, owner, extended attributes, flags): a directory the
// sandbox only made changes in needs no record, and its base (changed
// since, when the original made or removed an entry there) no check.
// In doubt, it differs.
func (rc *reconciler) attrsDiffer(p string, lo *lowerHit) bool {
	if lo == nil {
		_, changed, err := rc.l.classifyRoot(false)
		return err != nil || changed
	}
	kind, err := rc.l.compare(p, nil, lo, false, false)
	return err != nil || kind != ""
}

// copyOfGone names the upper object at p (st) when it is a copy of the
// original's object in p's place (its origin names it) that the original
// no longer has: removed or moved away by another writer after the
// sandbox copied it. It is named as the lost records would have (a
// file written, a directory's attributes set; one a record names, whose
// base came after it and was lost, keeps its records), with a base that the
// original's nothing fails: the commit refuses ("removed from the
// original", resolvable) as it does with the whole journal, instead of
// making the object again over the other writer's removal (found by a
// random test of power cuts with another writer, 2026-11-28).
func (rc *reconciler) copyOfGone(p string, st *unix.Stat_t) (bool, error) {
	var og origin
	var ok bool
	_ = rc.l.UpperDo(p, func(up string) error { og, ok = rc.l.readOrigin(up); return nil })
	x := rc.t.counterpartHere(p)
	if !ok || og.layer != 0 || og.path != x {
		return false, nil
	}
	if err := rc.goneBase(x, p, st); err != nil {
		return false, err
	}
	if !rc.t.unnamed(p) {
		return true, nil // its records kept, its base lost with those after
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		rc.emit(OpSetattr, p, "", AttrMode|AttrOwner)
	} else {
		rc.emit(OpWrite, p, "", 0)
	}
	return true, nil
}

// goneBase records, for the original path x that the original no longer
// has, unless the replay has a base of it, the base of what the upper
// object at p (st) copies: its origin's inode, its mode, a time before
// the copy was made. The original's nothing fails it: a commit refuses
// a change of x ("removed from the original") as with the whole journal.
func (rc *reconciler) goneBase(x, p string, st *unix.Stat_t) error {
	if _, seen := rc.t.seen[x]; seen {
		return nil
	}
	var og origin
	_ = rc.l.UpperDo(p, func(up string) error { og, _ = rc.l.readOrigin(up); return nil })
	born, err := rc.bornOf(p)
	if err != nil {
		return err
	}
	rc.emit(OpBase, x, Signature{Ino: og.ino, Mode: st.Mode, Ctime: born - 1}.String(), 0)
	return nil
}

// baseFor records the base of lo, the original's object that the upper
// object at p copies or replaces, unless the replay has one; with
// entries, of everything beneath it too. Only an object of the original
// that was last changed before the upper object was made is taken for
// what the sandbox saw (its ctime against the upper object's birth); one
// changed since, or one that is not the inode a copy's origin names,
// gets a base that matches nothing, so that a commit refuses over it:
// without the lost records nothing tells what the sandbox saw, and a
// base from now would have a commit overwrite (or remove) the
// original's change. (Until a review on 2026-11-28 such an object got
// no base, which a removal does not check: a commit removed it.)
func (rc *reconciler) baseFor(p string, lo *lowerHit, entries bool) error {
	born, err := rc.bornOf(p)
	if err != nil {
		return err
	}
	var og origin
	var hasOrigin bool
	var st unix.Stat_t
	_ = rc.l.UpperDo(p, func(up string) error {
		og, hasOrigin = rc.l.readOrigin(up)
		return unix.Lstat(up, &st)
	})
	if hasOrigin && og.ino != 0 && og.ino != rc.l.stableIno(lo.st.Dev, lo.st.Ino) {
		born = changedSince // another object than the one copied
	}
	return rc.base(lo, entries, born, st.Mode)
}

// bornSince reports whether the original's object hit was made at the
// time before (ns) or later, where its filesystem keeps birth times.
func (rc *reconciler) bornSince(hit *lowerHit, before int64) bool {
	var stx unix.Statx_t
	err := rc.l.lowerDo(hit.origin, func(lpath string) error {
		return unix.Statx(unix.AT_FDCWD, lpath, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME, &stx)
	})
	return err == nil && stx.Mask&unix.STATX_BTIME != 0 && stx.Btime.Sec*1e9+int64(stx.Btime.Nsec) >= before
}

// madeBy is the operation that makes an object of type typ.
func madeBy(typ uint32) Op {
	switch typ {
	case unix.S_IFREG:
		return OpCreate
	case unix.S_IFLNK:
		return OpSymlink
	default:
		return OpMknod
	}
}

// base records the base of the original's object hit, unless the
// replay has one: its signature, or one that matches nothing when it
// changed after the time before (ns); with subtree, of everything
// beneath it too. copyMode, when not 0, is the mode of the upper
// directory that copies hit.
func (rc *reconciler) base(hit *lowerHit, subtree bool, before int64, copyMode uint32) error {
	x := hit.origin.Path
	if _, seen := rc.t.seen[x]; !seen && hit.origin.Layer == 0 {
		sig := SignatureOf(&hit.st)
		if sig.Ctime >= before {
			// Changed since the sandbox could have seen it (or in the
			// same tick of the clock, which tells nothing apart): a
			// base that matches nothing the original can show, so
			// that a commit refuses over it ("changed in the
			// original"), removal included (a removal without a base
			// is none).
			sig.Ctime = before - 1
			if rc.bornSince(hit, before) {
				// Not the object the sandbox saw at all (a directory
				// removed and made again): "replaced in the
				// original", which the check of a change's parent
				// directories, comparing the inode alone, finds too.
				sig.Ino = 0
			}
			switch {
			case !hit.isDir() || copyMode == 0:
			case copyMode&unix.S_IFMT == unix.S_IFDIR:
				// A commit takes a directory whose mode is its
				// base's for one whose entries alone changed (each
				// checked on its own): the mode is the one the copy
				// was made with, so that a chmod the original made
				// since is a conflict, not put back (found on
				// 2026-11-28), unless the sandbox's lost chmod made
				// the copy's mode the original's.
				sig.Mode = copyMode
			default:
				// Removed or replaced by the sandbox, with no copy
				// to tell the mode it saw: one that matches nothing
				// (a lost rmdir took away a directory another writer
				// chmodded since).
				sig.Mode ^= 0o7777
			}
		}
		rc.emit(OpBase, x, sig.String(), 0)
	}
	if !subtree || !hit.isDir() {
		return nil
	}
	ents, err := rc.l.mergeDir("", nil, rc.l.lowerDirsAt(x))
	if err != nil {
		return fmt.Errorf("original %q: %w", x, err)
	}
	// A directory whose entries changed since may hold one the sandbox
	// never saw there: one made or moved in since (either sets its
	// ctime) gets no base, so that a commit taking the directory away
	// refuses over it ("not in the sandbox's view") rather than remove
	// it. (Until 2026-11-28 it got one, and a lost rm -r of a
	// directory removed what another writer had moved into it since.)
	changed := unix.TimespecToNsec(hit.st.Ctim) >= before
	for _, e := range ents {
		c, ok, err := rc.l.resolveLower(Join(x, e.Name))
		if err != nil {
			return err
		}
		if ok && !(changed && unix.TimespecToNsec(c.st.Ctim) >= before) {
			if err := rc.base(c, true, before, 0); err != nil {
				return err
			}
		}
	}
	return nil
}
