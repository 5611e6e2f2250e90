// Package layers is the overlay model of sbxfs, independent of FUSE: lookup
// through the upper layer and then the lower layers, copy-up, whiteouts,
// opaque and redirected directories, the change journal and the change set.
//
// The upper layer uses the kernel overlayfs on-disk layout (see
// docs/upper-format.md): a whiteout is a character device 0/0, an opaque
// directory carries the overlay "opaque" xattr and a renamed lower directory
// carries the overlay "redirect" xattr, in the trusted.* namespace when the
// server runs as root and in user.* otherwise.
//
// Paths handed to this package are overlay-relative ("" is the root, "a/b"
// a descendant) and already clean: callers build them from names the kernel
// gave, one component at a time.
package layers

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Config describes one overlay stack.
type Config struct {
	Upper  string   // writable layer
	Work   string   // scratch directory on the same filesystem as Upper
	Lowers []string // read-only layers, top first; Lowers[0] is the original
	// UserXattrs selects the user.overlay.* namespace; the default is
	// trusted.overlay.* when running as root and user.overlay.* otherwise.
	UserXattrs bool
	// Journal is the change journal path; empty means Work/journal.
	Journal string
}

// Origin names an object in a lower layer.
type Origin struct {
	Layer int // index into Config.Lowers
	// Path is the object's path in the original: the merged view of the
	// lower layers, where a directory a layer redirects (an upper used as
	// a lower, whose directory was renamed) shows the layers below it
	// under its new name.
	Path string
	// real is the path relative to the layer's root where a redirect in
	// a layer above makes it differ from Path; "" when it does not.
	real string
}

// layerPath is the object's path relative to its layer's root.
func (o Origin) layerPath() string {
	if o.real != "" {
		return o.real
	}
	return o.Path
}

// child is the origin of name in the directory o, in the same layer.
func (o Origin) child(name string) Origin {
	c := Origin{Layer: o.Layer, Path: Join(o.Path, name)}
	if o.real != "" {
		c.real = Join(o.real, name)
	}
	return c
}

// Obj says where one overlay object lives. For a non-directory, Upper is
// authoritative once set (copy-up is one-way) and Lowers holds at most the
// content source. For a directory, the upper part is checked live (unless
// a lookup found it absent since: see absentIn) and Lowers lists the lower
// directories merged beneath it, top first.
type Obj struct {
	Upper bool
	// prot is what the original object's immutable and append-only
	// flags forbid (protect.go), learnt when it was looked up.
	prot   fsutil.Protection
	Lowers []Origin
	// absentAt is 1 + the generation of upper directories (dirGen) at
	// which a lookup found nothing at this object's path in the upper
	// layer; 0 when not known.
	absentAt uint64
}

// Entry is the result of a lookup: where the object lives and its attributes
// (with the stable inode number in Stat.Ino).
type Entry struct {
	Obj
	Stat unix.Stat_t
}

// IsDir reports whether the entry is a directory.
func (e *Entry) IsDir() bool { return e.Stat.Mode&unix.S_IFMT == unix.S_IFDIR }

// Caller identifies who asked for an operation: the owner of new objects
// and the pid recorded in the journal.
type Caller struct {
	Pid uint32
	Uid uint32
	Gid uint32
	// Umask applies to the mode of an object it makes, unless the parent
	// directory has a default ACL (then the ACL decides, as on ext4).
	Umask uint32
}

// Layers is one mounted overlay stack. It is safe for concurrent use; the
// caller serialises operations on the same names the way the kernel does
// (directory locks), so this type keeps no lock per path.
type Layers struct {
	upper  string
	work   string
	lowers []string
	ns     xattrNames
	root   bool       // running as root: chown new objects to the caller
	permMu sync.Mutex // asOwner: one directory mode change at a time

	upperDev  uint64
	lowerDevs []uint64
	// The layers' directories, opened at the first read of a lower
	// object (lowerfs.go).
	rootsOnce sync.Once
	rootsMu   sync.RWMutex // held for reading while a root descriptor is used
	rootFds   []int
	rootsErr  error
	held      *heldDirs // lower directories kept for the next reads (lowerdirs.go)
	// ordered says the upper's filesystem writes a file's data before a
	// later rename (fsutil.OrdersDataBeforeRename): a copy-up need not
	// wait for its fsync.
	ordered bool

	devMu  sync.Mutex
	devIdx map[uint64]uint64

	// dirGen counts the directories the upper layer gained (dirgen.go).
	dirGen dirGen

	jmu       sync.RWMutex // guards journal, which Reset replaces, and onCompact
	journal   *Journal
	onCompact func(CompactResult)
	bases     sync.Map // original paths whose base signature is recorded

	// journalPath is the journal's path, mark the server mark's beside
	// it (reconcile.go); reconciled counts the records Open added to
	// reconcile the journal with the upper after an unclean stop.
	journalPath, mark string
	reconciled        int

	// testKeepDead has the change set classify the dead paths rather
	// than drop them (dropDead): the reference a test compares with.
	testKeepDead bool
}

// Errors a caller may want to tell apart.
var (
	ErrBadConfig    = errors.New("invalid overlay configuration")
	ErrCrossDevice  = errors.New("upper and work directories are on different mounts")
	ErrReservedName = errors.New("name is reserved for sbxfs")
)

// Open validates cfg, opens the journal (creating it when absent) and returns
// the stack.
func Open(cfg Config) (*Layers, error) {
	l, err := newLayers(cfg)
	if err != nil {
		return nil, err
	}
	j, err := OpenJournal(cfg.journalPath())
	if err != nil {
		return nil, err
	}
	j.ConfirmGone(l.goneFromUpper)
	l.journal = j
	if l.reconciled, err = l.reconcileOpened(); err != nil {
		j.Close()
		return nil, err
	}
	// Marked before anything changes the upper, so that a power cut
	// that keeps an upper change and loses its record finds the mark.
	if err := l.writeServerMark(); err != nil {
		j.Close()
		return nil, err
	}
	if err := l.adoptRoot(); err != nil {
		j.Close()
		return nil, err
	}
	return l, nil
}

// Reconciled is how many records Open added to the journal to name what
// the upper held and the journal did not, after its last server stopped
// uncleanly (reconcile.go); 0 after a clean stop.
func (l *Layers) Reconciled() int { return l.reconciled }

// adoptRoot gives a new upper root the original root's owner, mode,
// extended attributes (ACLs among them) and times, so the mount's root
// looks like the original's (the upper itself sits in a private 0700
// directory) and a commit of the root's metadata keeps what it did not
// change. Until 2026-11-27 the attributes were left behind: the mount's
// root showed none of them, new files in it inherited no default ACL, and
// a commit after a chmod of the root removed the original root's ACLs and
// user.* attributes (TestRootAttributesAreKept).
//
// An upper another overlay filled (kernel overlayfs, given to the
// mount-helper form) keeps its root as that overlay showed it, as kernel
// overlayfs would: only sbxfs's origin and the base are added.
func (l *Layers) adoptRoot() error {
	if _, ok := l.readOrigin(l.upper); ok {
		return nil
	}
	var st unix.Stat_t
	var err error
	if filled, ferr := dirHolds(l.upper); ferr != nil {
		return fmt.Errorf("upper %q: %w", l.upper, ferr)
	} else if filled {
		if err = unix.Stat(l.lowers[0], &st); err != nil {
			return fmt.Errorf("original %q: %w", l.lowers[0], err)
		}
		err = l.setRootOrigin(&st)
	} else {
		st, err = l.matchRoot()
	}
	if err != nil {
		return err
	}
	return l.noteBase(Origin{}, &st)
}

// dirHolds reports whether the directory dir has an entry.
func dirHolds(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	return len(names) > 0, err
}

// setRootOrigin marks the upper root as sbxfs's, with the stable inode
// number of the original root (whose lstat is st).
func (l *Layers) setRootOrigin(st *unix.Stat_t) error {
	og := origin{ino: l.stableIno(st.Dev, st.Ino), path: ""}
	if err := unix.Lsetxattr(l.upper, l.ns.origin, og.encode(), 0); err != nil {
		return fmt.Errorf("upper %q takes no %s attributes (%w); put the upper on a filesystem with xattr support", l.upper, l.ns.overlay, err)
	}
	return nil
}

// matchRoot gives the upper root the original root's owner, mode,
// attributes and times (adoptRoot), dropping any attribute of its own
// (Reset: after a rollback with --keep the root must be the original's
// again, as status says). It returns the original root's signature from
// before it read anything: the base of the root, which the journal
// records (the root is copied up here, not at its first change), so that
// a commit of the root's metadata is checked against what the original
// did since (before 2026-11-27 an attribute the original root got after
// the sandbox was made was lost by such a commit, without a conflict).
func (l *Layers) matchRoot() (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Stat(l.lowers[0], &st); err != nil {
		return st, fmt.Errorf("original %q: %w", l.lowers[0], err)
	}
	if l.root {
		if err := unix.Lchown(l.upper, int(st.Uid), int(st.Gid)); err != nil {
			return st, err
		}
	}
	if err := unix.Chmod(l.upper, st.Mode&0o7777); err != nil {
		return st, err
	}
	if err := l.adoptRootXattrs(); err != nil {
		return st, err
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, l.upper, []unix.Timespec{st.Atim, st.Mtim}, 0); err != nil {
		return st, err
	}
	return st, l.setRootOrigin(&st)
}

// adoptRootXattrs gives the upper root the original root's extended
// attributes, sbxfs's own aside, and the inode flags a copy keeps
// (fsutil.CopyFlags: what is made at the top of the sandbox inherits
// them, as in the original).
func (l *Layers) adoptRootXattrs() error {
	src, err := unix.Open(l.lowers[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("original %q: %w", l.lowers[0], err)
	}
	defer unix.Close(src)
	dst, err := unix.Open(l.upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("upper %q: %w", l.upper, err)
	}
	defer unix.Close(dst)
	fsutil.CopyFlags(dst, src)
	own, err := fsutil.ListXattrs(dst)
	if err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("upper %q: %w", l.upper, err)
	}
	for _, name := range own {
		if !l.Private(name) {
			if err := unix.Fremovexattr(dst, name); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("upper %q: remove %s: %w", l.upper, name, err)
			}
		}
	}
	if err := fsutil.CopyXattrs(dst, src, l.Private); err != nil {
		return fmt.Errorf("the attributes of the original %q: %w", l.lowers[0], err)
	}
	return nil
}

func (cfg *Config) userXattrs() bool { return cfg.UserXattrs || os.Geteuid() != 0 }

func (cfg *Config) journalPath() string {
	if cfg.Journal != "" {
		return cfg.Journal
	}
	return filepath.Join(cfg.Work, "journal")
}

// newLayers validates cfg and returns a stack without a journal, for
// read-only inspection.
func newLayers(cfg Config) (*Layers, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := fsutil.NeedProc(); err != nil {
		return nil, err
	}
	l := &Layers{
		upper:  cfg.Upper,
		work:   cfg.Work,
		lowers: cfg.Lowers,
		ns:     newXattrNames(cfg.userXattrs()),
		root:   os.Geteuid() == 0,
		devIdx: map[uint64]uint64{},

		journalPath: cfg.journalPath(),
		mark:        cfg.journalPath() + serverMarkSuffix,
	}
	var st unix.Stat_t
	if err := unix.Stat(l.upper, &st); err != nil {
		return nil, fmt.Errorf("upper %q: %w", l.upper, err)
	}
	l.devIdx[st.Dev] = 0 // the upper's device keeps raw inode numbers
	l.upperDev = st.Dev
	l.ordered = fsutil.OrdersDataBeforeRename(l.work)
	for _, d := range l.lowers {
		var ls unix.Stat_t
		if err := unix.Stat(d, &ls); err != nil {
			return nil, fmt.Errorf("lower %q: %w", d, err)
		}
		l.lowerDevs = append(l.lowerDevs, ls.Dev)
	}
	return l, nil
}

func (cfg *Config) validate() error {
	if cfg.Upper == "" || cfg.Work == "" || len(cfg.Lowers) == 0 {
		return fmt.Errorf("%w: upper, work and at least one lower are required", ErrBadConfig)
	}
	dirs := append([]string{cfg.Upper, cfg.Work}, cfg.Lowers...)
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			return fmt.Errorf("%w: %q is not an absolute path", ErrBadConfig, d)
		}
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("%w: %q: %v", ErrBadConfig, d, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("%w: %q is not a directory", ErrBadConfig, d)
		}
	}
	// Copy-ups are renamed from the work directory into the upper: one
	// filesystem is not enough, a bind mount refuses it (EXDEV), as
	// kernel overlayfs requires.
	if same, err := fsutil.SameMount(cfg.Upper, cfg.Work); err != nil || !same {
		return fmt.Errorf("%w: %q and %q", ErrCrossDevice, cfg.Upper, cfg.Work)
	}
	return nil
}

// Close flushes the journal, removes the server mark (the journal names
// all the upper holds) and closes the journal. The mark goes while the
// journal's lock is held: once it is let go, the next server may have
// written its own (found by a review on 2026-11-28).
func (l *Layers) Close() error {
	l.closeLowerRoots()
	j := l.Journal()
	if err := j.Sync(); err != nil {
		j.Close()
		return err
	}
	if err := l.removeServerMark(); err != nil {
		j.Close()
		return err
	}
	return j.Close()
}

// goneFromUpper reports, of each of paths, whether the upper holds
// nothing there (not even a whiteout): Journal.ConfirmGone. A path is
// resolved beneath the upper root without following a symlink; one on
// the way is an answer of "not gone" (as is any error but ENOENT and
// ENOTDIR), which only keeps a dead path. The names of one directory are
// looked at through one descriptor of it (an fstatat each, against an
// openat2 of the whole path: 20,000 editor save files in 20 directories
// ~0.9 us a path against ~1.9, BenchmarkGoneFromUpper).
func (l *Layers) goneFromUpper(paths []string) []bool {
	gone := make([]bool, len(paths))
	root, err := unix.Open(l.upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return gone
	}
	defer unix.Close(root)
	isGone := func(err error) bool { return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) }
	order := make([]int, len(paths))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		da, _ := Split(paths[a])
		db, _ := Split(paths[b])
		return strings.Compare(da, db)
	})
	dirFd, dirErr, dirOf := -1, error(nil), "\x00"
	closeDir := func() {
		if dirFd >= 0 && dirFd != root {
			unix.Close(dirFd)
		}
		dirFd = -1
	}
	defer closeDir()
	for _, i := range order {
		dir, name := Split(paths[i])
		if name == "" {
			continue // the root: never gone
		}
		if dir != dirOf {
			closeDir()
			dirOf, dirFd, dirErr = dir, root, nil
			if dir != "" {
				dirFd, dirErr = openUpperDirNoFollow(root, dir)
			}
		}
		if dirErr != nil {
			gone[i] = isGone(dirErr)
			continue
		}
		var st unix.Stat_t
		gone[i] = isGone(unix.Fstatat(dirFd, name, &st, unix.AT_SYMLINK_NOFOLLOW))
	}
	return gone
}

// openUpperDirNoFollow opens dir beneath root as goneFromUpper looks
// beneath it: a symlink there, which O_PATH|O_NOFOLLOW opens itself, is
// ELOOP (a symlink on the way), another non-directory ENOTDIR (nothing
// can be beneath it), as an open of a path beneath it would answer.
func openUpperDirNoFollow(root int, dir string) (int, error) {
	fd, err := fsutil.OpenBeneathRaw(root, dir, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return fd, nil
	case unix.S_IFLNK:
		err = unix.ELOOP
	default:
		err = unix.ENOTDIR
	}
	unix.Close(fd)
	return -1, err
}

// OnJournalCompact has fn told of every compaction of the change journal
// from now on, also after a Reset (Journal.OnCompact).
func (l *Layers) OnJournalCompact(fn func(CompactResult)) {
	l.jmu.Lock()
	defer l.jmu.Unlock()
	l.onCompact = fn
	l.journal.OnCompact(fn)
}

// Journal returns the change journal of this stack.
func (l *Layers) Journal() *Journal {
	l.jmu.RLock()
	defer l.jmu.RUnlock()
	return l.journal
}

// Sync makes every journal record appended so far durable.
func (l *Layers) Sync() error { return l.Journal().Sync() }

// UpperPath returns the real path of rel in the upper layer. A system
// call takes it only while it fits in PATH_MAX: act on rel through
// UpperDo (or upperAt) instead.
func (l *Layers) UpperPath(rel string) string { return join(l.upper, rel) }

// upperAt returns a path of rel in the upper layer that every system call
// takes, however deep rel is (fsutil.ShortPath: rel's own path while it
// fits in PATH_MAX, else one through a descriptor of a directory on the
// way). Close it after use. It fails as a call on rel would (ENOENT,
// ENOTDIR) when a directory on the way is not in the upper.
//
// ext4 and kernel overlayfs hold trees deeper than PATH_MAX; before
// 2026-11-28 every change beneath that depth failed with ENAMETOOLONG
// (TestDeepPathsThroughAMount).
func (l *Layers) upperAt(rel string) (fsutil.Short, error) { return fsutil.ShortPath(l.upper, rel) }

// UpperDo calls f with upperAt's path of rel, valid during f.
func (l *Layers) UpperDo(rel string, f func(path string) error) error {
	return fsutil.DoShort(l.upper, rel, f)
}

// OpenUpperRaw opens rel in the upper as it is (flags gain O_NOFOLLOW and
// O_CLOEXEC), however deep (upperAt).
func (l *Layers) OpenUpperRaw(rel string, flags int) (fd int, err error) {
	err = l.UpperDo(rel, func(p string) error {
		fd, err = unix.Open(p, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return err
	})
	return fd, err
}

// UpperDir is the upper layer's root.
func (l *Layers) UpperDir() string { return l.upper }

// XattrPrefix is the namespace sbxfs and overlayfs use for their own
// attributes ("trusted.overlay." or "user.overlay.").
func (l *Layers) XattrPrefix() string { return l.ns.overlay }

func join(root, rel string) string {
	if rel == "" {
		return root
	}
	return root + "/" + rel
}

// Join appends name to the overlay-relative directory path dir.
func Join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// Split splits the overlay-relative path p into its directory and name.
func Split(p string) (dir, name string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p
	}
	return p[:i], p[i+1:]
}

// stableIno maps an inode number of the filesystem dev to the overlay's
// inode number space: objects on the upper's filesystem keep their number,
// other filesystems get a distinct prefix in the top byte (as overlayfs xino).
func (l *Layers) stableIno(dev, ino uint64) uint64 {
	l.devMu.Lock()
	idx, ok := l.devIdx[dev]
	if !ok {
		idx = uint64(len(l.devIdx))
		l.devIdx[dev] = idx
	}
	l.devMu.Unlock()
	return ino ^ idx<<56
}

func (l *Layers) record(op Op, path, path2 string, flags uint32, c Caller) error {
	return l.Journal().Append(Record{Op: op, Path: path, Path2: path2, Flags: flags, Pid: c.Pid, Time: now()})
}
