package fuse

import (
	"cmp"
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// Directory listings and the kernel's listing cache.
//
// Directories are opened with FOPEN_CACHE_DIR: the kernel keeps a listing
// it has read whole and serves later opens from it, until the directory
// changes through the mount. The kernel builds that cache from READDIR
// replies of any open handle of the directory, appending a reply's entries
// when the reply starts at the offset where the cache ends. That is only
// right when
//   - an offset means the same position in every handle and at every time
//     (a cookie, not an index into one handle's snapshot), and
//   - every reply shows the directory as it is when the reply is made.
//
// An earlier sbxfs broke both (a per-handle snapshot, offsets counted in
// it) and a listing made of two snapshots could miss a name or show a
// removed one, for good. So here an entry's offset is a hash of its name,
// the listing is sorted by it (ext4's htree does the same), and each reply
// comes from the directory's current listing, which a node keeps only
// while no name in it changed (dirChanged).
//
// Since nothing depends on an open handle, sbxfs does without them: it
// answers OPENDIR with ENOSYS, and the kernel (5.1 and later, which say so
// in INIT) then sends no OPENDIR or RELEASEDIR for any directory again and
// keeps listings as with FOPEN_CACHE_DIR|FOPEN_KEEP_CACHE. That saves two
// round trips a directory a walk enters, warm or cold. READDIR and
// READDIRPLUS then come with no handle, and rawFS opens one in go-fuse for
// the length of the request.

// cookie reserves offsets 1 and 2 for "." and ".."; 0 is the start.
const firstCookie = 3

// listing is a directory's merged listing in cookie order.
type listing struct {
	gen  uint64 // the node's dir generation it was made at
	made time.Time
	ents []gofuse.DirEntry // Off is the entry's cookie, ascending
}

// after returns the index of the first entry whose cookie is above off.
func (l *listing) after(off uint64) int {
	i, found := slices.BinarySearchFunc(l.ents, off, func(e gofuse.DirEntry, off uint64) int {
		return cmp.Compare(e.Off, off)
	})
	if found {
		i++
	}
	return i
}

// dirState is what a directory node keeps for its listings.
type dirState struct {
	mu   sync.Mutex
	gen  uint64   // bumped by every change of the names in the directory
	list *listing // the current listing, nil when stale or read to its end
	// served says a reply was made since the kernel last dropped its
	// cache of the directory: only replies fill that cache.
	served bool
	// statted says the kernel looked up a child that is no directory:
	// someone reads the attributes of the entries here (ls -l, du, tar,
	// git status), not only walks the tree (find). See attrsWanted. Set
	// once, read without mu (a LOOKUP's hot path).
	statted atomic.Bool
	// childStatted says a subdirectory is statted: a walk that reads
	// attributes (rm -r, du, cp -r) goes on to its siblings.
	childStatted atomic.Bool
}

// dirChanged records that a name in directory n was added, removed or
// replaced: the next reply lists it anew, and the kernel drops the listing
// it keeps. It is called before the operation is answered.
//
// The kernel means to notice a change itself (the directory's i_version
// and mtime, checked whenever a listing starts), but under many writers a
// listing served from its cache right after a change still missed it now
// and then (TestRealConcurrentWriters: 3 runs in 8 failed with only that,
// none of 22 with the explicit drop). Dropping costs a write to /dev/fuse, which
// the kernel handles without taking a directory lock; it is made only
// when a reply was served since the last drop (rm -rf lists a directory
// once, then removes every name: one drop, not one a name).
func (n *node) dirChanged() {
	if n.forgetListing() {
		_ = n.NotifyContent(0, 0)
	}
}

// forgetListing makes the next reply list n anew. It reports whether a
// reply was served since the last call (the kernel may hold a listing).
func (n *node) forgetListing() (served bool) {
	if n.dir == nil {
		return false // no directory
	}
	n.dir.mu.Lock()
	defer n.dir.mu.Unlock()
	served, n.dir.served = n.dir.served, false
	n.dir.gen++
	n.dir.list = nil
	return served
}

// listing returns n's current listing, made anew when a name changed
// since, or when it is older than the attribute timeout (the original may
// change behind the sandbox's back; such changes are seen as late as
// attributes are).
func (n *node) listing() (*listing, syscall.Errno) {
	n.dir.mu.Lock()
	l, gen := n.dir.list, n.dir.gen
	n.dir.served = true
	n.dir.mu.Unlock()
	if l != nil && time.Since(l.made) < n.fs.attrTimeout {
		return l, 0
	}
	l, errno := n.makeListing(gen)
	if errno != 0 {
		return nil, errno
	}
	n.dir.mu.Lock()
	if n.dir.gen == gen {
		n.dir.list = l
	}
	n.dir.mu.Unlock()
	return l, 0
}

// doneListing drops l, n's listing, once the reply that says "end" (an
// empty one) was made from it: the kernel has it whole now, and keeps it.
func (n *node) doneListing(l *listing) {
	n.dir.mu.Lock()
	if n.dir.list == l {
		n.dir.list = nil
	}
	n.dir.mu.Unlock()
}

func (n *node) makeListing(gen uint64) (*listing, syscall.Errno) {
	rel, obj, errno := n.dirArgs()
	if errno != 0 {
		return nil, errno
	}
	made := time.Now()
	ents, err := n.fs.layers.ReadDir(rel, obj)
	if err != nil {
		return nil, n.fs.toErrno("readdir", err)
	}
	list := make([]gofuse.DirEntry, 0, len(ents)+2)
	for _, e := range ents {
		list = append(list, gofuse.DirEntry{Name: e.Name, Mode: e.Type, Ino: e.Ino, Off: n.fs.cookie(e.Name)})
	}
	slices.SortFunc(list, func(a, b gofuse.DirEntry) int {
		if c := cmp.Compare(a.Off, b.Off); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	// Two names with one hash (about never): the later one takes the
	// next free cookie, which the same set of names always gives it.
	for i := 1; i < len(list); i++ {
		if list[i].Off <= list[i-1].Off {
			list[i].Off = list[i-1].Off + 1
		}
	}
	n.prefetchSubdirs(obj, list)
	list = slices.Insert(list, 0,
		gofuse.DirEntry{Name: ".", Mode: unix.S_IFDIR, Ino: n.StableAttr().Ino, Off: 1},
		gofuse.DirEntry{Name: "..", Mode: unix.S_IFDIR, Ino: 1, Off: 2})
	return &listing{gen: gen, made: made, ents: list}, 0
}

// prefetchSubdirs hands the subdirectories in list (cookie order) that
// the original's layers may have to the background readers (prefetch.go).
func (n *node) prefetchSubdirs(obj layers.Obj, list []gofuse.DirEntry) {
	if len(obj.Lowers) == 0 {
		return
	}
	var dirs []opener
	l := n.fs.layers
	for _, e := range list {
		if e.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		for _, lo := range obj.Lowers {
			name := e.Name
			dirs = append(dirs, func() (int, error) { return l.OpenLowerChild(lo, name, unix.O_RDONLY|unix.O_DIRECTORY) })
		}
		if len(dirs) >= prefetchPerListing {
			break
		}
	}
	if len(dirs) > 0 {
		prefetchDirs(dirs)
	}
}

// cookie is the offset of the entry after name: a hash of the name, so
// every handle and every listing of the directory agree on it. It stays
// below 2^62, clear of the kernel's signed offsets and of the ones
// reserved for the start, "." and "..".
func (fs *filesystem) cookie(name string) uint64 {
	return maphash.String(fs.cookieSeed, name)>>2 + firstCookie
}

var _ = (fusefs.NodeOpendirHandler)((*node)(nil))

// OpendirHandle opens a directory for reading: for one READDIR request
// (rawFS), or, under a kernel that needs OPENDIR, for the kernel's open
// file; the kernel may keep what it reads (see the top of this file).
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{n: n}, gofuse.FOPEN_CACHE_DIR | gofuse.FOPEN_KEEP_CACHE, 0
}

// dirHandle is an open directory: a position (the cookie of the last
// entry handed out) in the directory's current listing.
type dirHandle struct {
	n   *node
	mu  sync.Mutex
	pos uint64
	// lastMode is the type of the entry Readdirent handed out last, the
	// one Lookup is asked about.
	lastMode uint32
}

var (
	_ = (fusefs.FileLookuper)((*dirHandle)(nil))
	_ = (fusefs.FileReaddirenter)((*dirHandle)(nil))
	_ = (fusefs.FileSeekdirer)((*dirHandle)(nil))
	_ = (fusefs.FileFsyncdirer)((*dirHandle)(nil))
)

// Readdirent returns the entry after the handle's position in the current
// listing. It ends a reply (nil) when the entry would not fit in what is
// left of it: go-fuse would otherwise keep that entry for the next reply,
// made later, when the entry may be gone.
func (d *dirHandle) Readdirent(ctx context.Context) (*gofuse.DirEntry, syscall.Errno) {
	defer d.n.fs.names.shared()()
	l, errno := d.n.listing()
	if errno != 0 {
		return nil, errno
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	i := l.after(d.pos)
	if i == len(l.ents) {
		if d.n.fs.replies.empty(ctx) {
			// The reply that says "end": the kernel has it all.
			d.n.doneListing(l)
		}
		return nil, 0
	}
	e := l.ents[i]
	if !d.n.fs.replies.take(ctx, e.Name) {
		return nil, 0
	}
	d.pos, d.lastMode = e.Off, e.Mode
	return &e, 0
}

// errNoAttrs leaves an entry of a READDIRPLUS reply without a node id:
// the kernel then takes the name and type only, as from a READDIR, and
// looks the entry up when someone needs it.
const errNoAttrs = syscall.ENOENT

// Lookup gives the attributes of one entry of a READDIRPLUS reply, or
// none (errNoAttrs). The kernel asks for them with every first listing
// of a directory, but reading them costs an inode read per entry, which
// a walk that only needs names and types (find, a build's scan for
// files) never pays on ext4: cold, that made such a walk several times
// slower than the listing itself. So an entry gets its attributes only
// when the kernel does not know it yet (a known entry has attributes the
// kernel keeps for the attribute timeout), and
//   - it is a directory: a walk enters it, and would look it up, reading
//     the same inode, one round trip later; or
//   - someone reads the attributes of entries in this directory, its
//     parent, or a sibling directory (attrsWanted).
func (d *dirHandle) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	defer d.n.fs.names.shared()()
	d.mu.Lock()
	dir := d.lastMode&unix.S_IFMT == unix.S_IFDIR
	d.mu.Unlock()
	if d.n.GetChild(name) != nil || !dir && !d.n.attrsWanted() {
		return nil, errNoAttrs
	}
	return d.n.lookup(ctx, name, out)
}

// attrsWanted reports whether a kernel LOOKUP of a child that is no
// directory was seen in n, in its parent or in a sibling directory: the
// sign of a walk that reads attributes (a tree walk alone looks up
// directories only, to enter them). Siblings count for rm -r, which
// lists a directory and then unlinks each entry: an entry listed without
// attributes must be looked up first, two round trips a file instead of
// one.
func (n *node) attrsWanted() bool {
	if n.statted() {
		return true
	}
	pn := n.parentDir()
	return pn != nil && (pn.statted() || pn.dir.childStatted.Load())
}

func (n *node) statted() bool { return n.dir.statted.Load() }

// parentDir is the node of n's parent directory, nil for the root.
func (n *node) parentDir() *node {
	_, parent := n.Parent()
	if parent == nil {
		return nil
	}
	pn, ok := parent.Operations().(*node)
	if !ok {
		return nil
	}
	return pn
}

// noteLookup records that the kernel looked up a child of n of type mode.
func (n *node) noteLookup(mode uint32) {
	if mode&unix.S_IFMT != unix.S_IFDIR && !n.dir.statted.Load() {
		n.dir.statted.Store(true)
		if pn := n.parentDir(); pn != nil {
			pn.dir.childStatted.Store(true)
		}
	}
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	d.pos = off
	d.mu.Unlock()
	return 0
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.Fsync(ctx, nil, flags)
}

// replies tracks the room left in the READDIR replies being made, so a
// handle hands go-fuse only entries that fit (see Readdirent). rawFS
// registers each reply under its request's cancel channel, which go-fuse
// passes to Readdirent in the context.
type replies struct{ m sync.Map }

type reply struct {
	left  int
	plus  bool
	empty bool
}

// Sizes of the READDIR(PLUS) records (struct fuse_dirent, fuse_entry_out).
const direntSize = 24

var entryOutSize = int(unsafe.Sizeof(gofuse.EntryOut{}))

// empty reports whether the reply ctx is making has no entry yet.
func (r *replies) empty(ctx context.Context) bool {
	c, ok := ctx.(*gofuse.Context)
	if !ok || c.Cancel == nil {
		return true
	}
	v, ok := r.m.Load(c.Cancel)
	return !ok || v.(*reply).empty
}

// take reports whether an entry named name fits in the reply ctx is
// making, and counts its room as used. Outside a tracked reply, or for
// the first entry of one, it always does.
func (r *replies) take(ctx context.Context, name string) bool {
	c, ok := ctx.(*gofuse.Context)
	if !ok || c.Cancel == nil {
		return true
	}
	v, ok := r.m.Load(c.Cancel)
	if !ok {
		return true
	}
	rp := v.(*reply)
	size := direntSize + len(name) + (8-len(name)&7)&7
	if rp.plus {
		size += entryOutSize
	}
	if !rp.empty && size > rp.left {
		return false
	}
	rp.empty = false
	rp.left -= size
	return true
}

// rawFS is go-fuse's filesystem with directories served without OPENDIR
// (see the top of this file), the sizes of READDIR replies passed on to
// the handles that fill them, and the umask of requests that make objects
// passed on to the nodes that make them (umask.go).
type rawFS struct {
	gofuse.RawFileSystem
	replies *replies
	umasks  *umasks
	kills   *killWrites
	server  *gofuse.Server
	dev     *devLoop // set before it serves: large reads are spliced (Read)
}

func (r *rawFS) Init(s *gofuse.Server) {
	r.server = s
	r.RawFileSystem.Init(s)
}

// OpenDir answers ENOSYS where the kernel can do without OPENDIR (it says
// so in INIT): it stops sending OPENDIR and RELEASEDIR.
func (r *rawFS) OpenDir(cancel <-chan struct{}, in *gofuse.OpenIn, out *gofuse.OpenOut) gofuse.Status {
	if r.server != nil && r.server.KernelSettings().Flags&gofuse.CAP_NO_OPENDIR_SUPPORT != 0 {
		return gofuse.ENOSYS
	}
	return r.RawFileSystem.OpenDir(cancel, in, out)
}

func (r *rawFS) ReadDir(cancel <-chan struct{}, in *gofuse.ReadIn, out *gofuse.DirEntryList) gofuse.Status {
	return r.readDir(cancel, in, out, false)
}

func (r *rawFS) ReadDirPlus(cancel <-chan struct{}, in *gofuse.ReadIn, out *gofuse.DirEntryList) gofuse.Status {
	return r.readDir(cancel, in, out, true)
}

// readDir makes one READDIR(PLUS) reply, through a handle opened for it
// when the kernel sent none.
func (r *rawFS) readDir(cancel <-chan struct{}, in *gofuse.ReadIn, out *gofuse.DirEntryList, plus bool) gofuse.Status {
	r.replies.m.Store(cancel, &reply{left: int(in.Size), plus: plus, empty: true})
	defer r.replies.m.Delete(cancel)
	if in.Fh == 0 {
		var oo gofuse.OpenOut
		if st := r.RawFileSystem.OpenDir(cancel, &gofuse.OpenIn{InHeader: in.InHeader}, &oo); !st.Ok() {
			return st
		}
		defer r.RawFileSystem.ReleaseDir(&gofuse.ReleaseIn{InHeader: in.InHeader, Fh: oo.Fh})
		withFh := *in
		withFh.Fh = oo.Fh
		in = &withFh
	}
	if plus {
		return r.RawFileSystem.ReadDirPlus(cancel, in, out)
	}
	return r.RawFileSystem.ReadDir(cancel, in, out)
}
