package fuse

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// filesystem is the state shared by every node of one mount.
type filesystem struct {
	layers      *layers.Layers
	log         *slog.Logger
	passthrough bool
	root        *node
	rootIno     uint64
	gate        gate
	names       names
	writers     writers
	attrTimeout time.Duration
	cookieSeed  maphash.Seed // for directory offsets (cookie)
	replies     replies
	umasks      umasks
	kills       killWrites
	registry    registry
	// layersMayStall: a layer's directory is on FUSE (maybe a mount this
	// process serves) or a network filesystem (uringTransport.offThread).
	layersMayStall bool

	stop chan struct{}
	done chan struct{}
}

// node is one file, directory or other object of the mount. Its overlay
// path is derived from go-fuse's tree, which follows renames; obj says
// where the object lives and is guarded by mu.
type node struct {
	fusefs.Inode
	fs *filesystem

	mu  sync.Mutex
	obj layers.Obj
	// cached counts open handles served without passthrough. While any is
	// open, new handles are not passthrough either: the kernel refuses to
	// mix the two modes on one inode.
	cached int
	// open holds the node's open handles, so a node unlinked while open
	// can still be changed through one of them.
	open map[*handle]bool
	// last is what the node keeps of its last known attributes, for an
	// fstat after it was removed while open.
	last lastAttrs
	// dir is a directory's listing state (node_dir.go), nil for any
	// other node: a file or link node is a quarter smaller without it.
	dir *dirState
	// reissued: n is a name of an original file with several links, and
	// its kernel entry was dropped once a copy-up parted it (reissue);
	// linkedHere: the sandbox gave n another name (Link), so dropping
	// one entry would part names the sandbox links.
	reissued, linkedHere bool
}

// openFd returns the descriptor of an open handle of n, an upper one when
// there is one, or -1: the way to reach a file no longer reachable by
// path. upper says which kind it is.
func (n *node) openFd() (fd int, upper bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fd = -1
	for h := range n.open {
		h.mu.RLock()
		hfd, up := h.fd, h.upper
		h.mu.RUnlock()
		if hfd >= 0 && up {
			return hfd, true
		}
		if hfd >= 0 {
			fd = hfd
		}
	}
	return fd, false
}

// target says how to reach n for reading: by path, or (unlinked while
// open) through an open descriptor. errno is ENOENT when neither works.
func (n *node) target() (rel string, fd int, errno syscall.Errno) {
	if rel, ok := n.rel(); ok {
		return rel, -1, 0
	}
	if fd, _ := n.openFd(); fd >= 0 {
		return "", fd, 0
	}
	return "", -1, syscall.ENOENT
}

// mutableTarget is target for a change: an original file deleted in the
// sandbox while open is first copied to an unnamed upper file, which its
// handles then use (the original is never written).
func (n *node) mutableTarget() (rel string, fd int, errno syscall.Errno) {
	if rel, ok := n.rel(); ok {
		return rel, -1, 0
	}
	fd, upper := n.openFd()
	if fd < 0 || upper {
		return n.target()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var lowerHandles []*handle
	for h := range n.open {
		if !h.upper {
			lowerHandles = append(lowerHandles, h)
		}
	}
	copyFd, err := n.fs.layers.CopyOrphan(fd)
	if err != nil {
		return "", -1, n.fs.toErrno("copy up", err)
	}
	for i, h := range lowerHandles {
		nfd := copyFd
		if i > 0 {
			if nfd, err = fsutil.Dup(copyFd); err != nil {
				return "", -1, n.fs.toErrno("copy up", err)
			}
		}
		h.mu.Lock()
		unix.Close(h.fd)
		h.fd, h.upper = nfd, true
		h.mu.Unlock()
	}
	return "", copyFd, 0
}

func (fs *filesystem) newRoot() (*node, error) {
	e, err := fs.layers.Root()
	if err != nil {
		return nil, err
	}
	fs.root = newNode(fs, e.Obj, unix.S_IFDIR)
	fs.rootIno = e.Stat.Ino
	return fs.root, nil
}

// rel returns the node's overlay-relative path; ok is false for a node no
// longer reachable from the root (unlinked while open).
func (n *node) rel() (string, bool) {
	var parts []string
	cur := &n.Inode
	root := n.fs.root.EmbeddedInode()
	for cur != root {
		name, parent := cur.Parent()
		if parent == nil {
			return "", false
		}
		parts = append(parts, name)
		cur = parent
	}
	p := ""
	for i := len(parts) - 1; i >= 0; i-- {
		p = layers.Join(p, parts[i])
	}
	return p, true
}

func (n *node) getObj() layers.Obj {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.obj
}

func caller(ctx context.Context) layers.Caller {
	if c, ok := gofuse.FromContext(ctx); ok {
		return layers.Caller{Pid: c.Pid, Uid: c.Uid, Gid: c.Gid}
	}
	return layers.Caller{}
}

// newChild returns the inode for the entry e found or made as name in n;
// go-fuse uses the node it already has when the stable attributes are
// known (a hard link, a second lookup).
//
// The names of an original file with several links get a node each (a
// generation number of their own): a copy-up breaks the link, as in
// kernel overlayfs without index=on, so what is written through one name
// must not show through the others, in the kernel's page cache or its
// attributes. They show the original's st_ino, a copied-up one too until
// its kernel entry is dropped (go-fuse answers with a node's stable
// number; see reissue); kernel overlayfs shows the copy's at once.
//
// A copied-up name whose node is not reissued yet (open, or linked in the
// sandbox) keeps that node: a new one for the same name would give the
// kernel two inodes for one upper file, and go-fuse, which replaces a
// child without taking the old node's parent entry away, would leave the
// old node reaching the object through a name that is no longer its own
// (once that name moved on or went, the old node's operations failed or
// hit another file). Any other file node a lookup replaces is taken out
// of n first, for the same reason.
func (n *node) newChild(ctx context.Context, name string, e *layers.Entry, out *gofuse.EntryOut) *fusefs.Inode {
	child := newNode(n.fs, e.Obj, e.Stat.Mode)
	sa := fusefs.StableAttr{Mode: e.Stat.Mode & unix.S_IFMT, Ino: e.Stat.Ino}
	if !e.Upper && sa.Mode != unix.S_IFDIR && e.Stat.Nlink > 1 {
		sa.Gen = n.linkGen(name)
	}
	if old := n.GetChild(name); old != nil && old.StableAttr() != sa {
		if on, ok := old.Operations().(*node); ok && on.keeps(e) {
			fillAttr(&out.Attr, &e.Stat, old.StableAttr().Ino)
			return old
		}
		if !old.IsDir() {
			// A file node still held (a descriptor opened as it was
			// replaced) then works through its descriptor, not a path
			// that may hold another file by now. A directory keeps
			// its entry: it has one name, the one now looked up.
			n.RmChild(name)
		}
	}
	ino := n.NewInode(ctx, child, sa)
	n.fs.registry.adopt(sa, child, e) // once child is set up: another lookup may read it
	fillAttr(&out.Attr, &e.Stat, ino.StableAttr().Ino)
	if cn, ok := ino.Operations().(*node); ok {
		cn.mu.Lock()
		cn.last = keepAttrs(&e.Stat)
		cn.mu.Unlock()
	}
	return ino
}

// keeps reports whether n, the node a lookup found as e, stays the node
// of its name: a name of an original hard link (see newChild) copied up
// since, and not reissued. It takes e's state.
func (n *node) keeps(e *layers.Entry) bool {
	if n.StableAttr().Gen == 0 || !e.Upper || e.Stat.Mode&unix.S_IFMT != n.StableAttr().Mode {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.reissued {
		return false
	}
	n.obj, n.last = e.Obj, keepAttrs(&e.Stat)
	return true
}

// reissue drops the kernel's entry for n, at name in parent, once n is a
// name of an original file with several links (a node with a generation
// number: newChild) that a copy-up parted from the others, and no handle
// holds it open: the next lookup makes a node with the copy's st_ino, so
// the parted names stop showing one number (cp(1) refused to copy one
// over the other: "are the same file"). An open handle defers it to the
// last release, so one upper file never has two kernel inodes (two page
// caches) open at once; a link made in the sandbox while one is open
// keeps it (its names share this node; see Link). It reports whether it
// did.
//
// The entry is dropped from another goroutine: the kernel takes the
// directory's lock for it, which a rename or link being answered holds.
// Until the drop is through, a stat of the name would still reach n, and
// show the original's number and link count from the kernel's cache: so
// n's attributes are dropped at once (that takes no lock), and n answers
// the GETATTR that follows with ESTALE (see stale).
func (n *node) reissue(parent *fusefs.Inode, name string) bool {
	if parent == nil || !n.parted() {
		return false
	}
	n.dropEntry(parent, name)
	return true
}

// dropEntry is the kernel's side of reissue: see there.
func (n *node) dropEntry(parent *fusefs.Inode, name string) {
	_ = n.NotifyContent(-1, 0)
	go parent.NotifyEntry(name)
}

// stale reports whether n is a node reissue took away. A syscall that
// reached it by path (through the kernel's entry before the drop was
// through, or a walk that found the entry just before) is answered
// ESTALE, which the kernel's path walks (stat, open, access and the
// others) take as the sign to look each name up again (LOOKUP_REVAL), and
// so meet the node of the copy. What holds n otherwise (an O_PATH
// descriptor) gets ESTALE too, as from NFS once a file is replaced.
func (n *node) stale() bool {
	if n.StableAttr().Gen == 0 {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reissued
}

// parted reports (once) that n may be reissued: see reissue.
func (n *node) parted() bool {
	if n.StableAttr().Gen == 0 {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.partedLocked()
}

func (n *node) partedLocked() bool {
	ok := n.obj.Upper && len(n.open) == 0 && !n.reissued && !n.linkedHere
	n.reissued = n.reissued || ok
	return ok
}

// linkedLocked settles, as one step with the link the sandbox just made
// to n (n.mu held throughout: a release of n's last handle in between
// would reissue n while the new name joins it, and leave the two names on
// two nodes), what becomes of n: parted now (drop: n's entry is to be
// dropped), or before (n stale), the new name gets a node of its own (own),
// the copy's; else it joins n (linkedHere).
func (n *node) linkedLocked() (own, drop bool) {
	if n.StableAttr().Gen == 0 {
		return false, false
	}
	if n.reissued {
		return true, false
	}
	if n.partedLocked() {
		return true, true
	}
	n.linkedHere = true
	return false, false
}

// reissueHere is reissue at n's current name.
func (n *node) reissueHere() bool {
	if n.StableAttr().Gen == 0 {
		return false
	}
	name, parent := n.Parent()
	return n.reissue(parent, name)
}

// linkGen is the generation number of the node for name in n when name is
// one of several links of an original file: the same for every lookup of
// that name in that directory, different for another name, never 0.
func (n *node) linkGen(name string) uint64 {
	var h maphash.Hash
	h.SetSeed(n.fs.cookieSeed)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], n.StableAttr().Ino)
	h.Write(b[:])
	h.WriteString(name)
	return h.Sum64() | 1
}

// newNode makes the node of an object of type mode (S_IFMT bits) kept
// in obj.
func newNode(fs *filesystem, obj layers.Obj, mode uint32) *node {
	n := &node{fs: fs, obj: obj}
	if mode&unix.S_IFMT == unix.S_IFDIR {
		n.dir = &dirState{}
	}
	return n
}

// lastAttrs is what a node keeps of its last known attributes: what
// fillAttr sends of a unix.Stat_t, in 80 bytes instead of 144 (every
// node the kernel knows has one). The zero value says none are known
// (every object has a type in its mode).
type lastAttrs struct {
	size, blocks              int64
	atime, mtime, ctime       int64
	atimeNs, mtimeNs, ctimeNs uint32
	mode, nlink, uid, gid     uint32
	rdev, blksize             uint32
}

func keepAttrs(st *unix.Stat_t) lastAttrs {
	return lastAttrs{
		size: st.Size, blocks: st.Blocks,
		atime: st.Atim.Sec, mtime: st.Mtim.Sec, ctime: st.Ctim.Sec,
		atimeNs: uint32(st.Atim.Nsec), mtimeNs: uint32(st.Mtim.Nsec), ctimeNs: uint32(st.Ctim.Nsec),
		mode: st.Mode, nlink: uint32(st.Nlink), uid: st.Uid, gid: st.Gid,
		rdev: uint32(st.Rdev), blksize: uint32(st.Blksize),
	}
}

// stat returns the attributes kept (without device and inode numbers:
// the node's stable number stands for the latter) and whether any are.
func (a *lastAttrs) stat() (unix.Stat_t, bool) {
	st := unix.Stat_t{
		Size: a.size, Blocks: a.blocks,
		Atim: unix.Timespec{Sec: a.atime, Nsec: int64(a.atimeNs)},
		Mtim: unix.Timespec{Sec: a.mtime, Nsec: int64(a.mtimeNs)},
		Ctim: unix.Timespec{Sec: a.ctime, Nsec: int64(a.ctimeNs)},
		Mode: a.mode, Uid: a.uid, Gid: a.gid, Rdev: uint64(a.rdev),
	}
	fsutil.SetInt(&st.Nlink, int64(a.nlink)) // their width differs between architectures
	fsutil.SetInt(&st.Blksize, int64(a.blksize))
	return st, a.mode != 0
}

// fillAttr copies st into out with the node's stable inode number.
func fillAttr(out *gofuse.Attr, st *unix.Stat_t, ino uint64) {
	out.Ino = ino
	out.Size = uint64(st.Size)
	out.Blocks = uint64(st.Blocks)
	out.Atime, out.Atimensec = uint64(st.Atim.Sec), uint32(st.Atim.Nsec)
	out.Mtime, out.Mtimensec = uint64(st.Mtim.Sec), uint32(st.Mtim.Nsec)
	out.Ctime, out.Ctimensec = uint64(st.Ctim.Sec), uint32(st.Ctim.Nsec)
	out.Mode = st.Mode
	out.Nlink = uint32(st.Nlink)
	out.Uid, out.Gid = st.Uid, st.Gid
	out.Rdev = uint32(st.Rdev)
	out.Blksize = uint32(st.Blksize)
}

// startFlusher makes journal appends durable on a short timer, so a
// power loss costs at most that much of the record of changes whose data
// was not fsynced either.
func (fs *filesystem) startFlusher() {
	fs.stop, fs.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(fs.done)
		t := time.NewTicker(journalSyncEvery())
		defer t.Stop()
		for {
			select {
			case <-fs.stop:
				return
			case <-t.C:
				if err := fs.layers.Sync(); err != nil {
					fs.log.Error("journal sync", slog.Any("err", err))
				}
			}
		}
	}()
}

// journalSyncEvery is the flusher's period: 200 ms, or
// SBXFS_JOURNAL_SYNC_EVERY (a Go duration), for tests that need the
// journal's tail to stay in the page cache while the upper's changes
// reach the disk, as a power cut can find them.
func journalSyncEvery() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("SBXFS_JOURNAL_SYNC_EVERY")); err == nil && d > 0 {
		return d
	}
	return 200 * time.Millisecond
}

func (fs *filesystem) stopFlusher() {
	if fs.stop != nil {
		close(fs.stop)
		<-fs.done
		fs.stop = nil
	}
}

var _ = (fusefs.NodeLookuper)((*node)(nil))

func (n *node) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	defer n.fs.names.shared()()
	child, errno := n.lookup(ctx, name, out)
	if errno == 0 {
		n.noteLookup(out.Attr.Mode)
	}
	return child, errno
}

// lookup finds the child name of n and makes its node.
func (n *node) lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	rel, ok := n.rel()
	if !ok {
		return nil, syscall.ENOENT
	}
	e, err := n.fs.layers.Lookup(rel, n.getObj(), name)
	if err != nil {
		return nil, n.fs.toErrno("lookup", err)
	}
	return n.newChild(ctx, name, &e, out), 0
}

var _ = (fusefs.NodeGetattrer)((*node)(nil))

func (n *node) Getattr(ctx context.Context, f fusefs.FileHandle, out *gofuse.AttrOut) syscall.Errno {
	defer n.fs.names.shared()()
	if f == nil && n.stale() {
		return syscall.ESTALE
	}
	st, err := n.stat(f)
	if err != nil {
		return n.fs.toErrno("getattr", err)
	}
	fillAttr(&out.Attr, &st, n.StableAttr().Ino)
	return 0
}

// stat returns n's attributes: through the open file when there is one
// (a file unlinked while open, or an original file open read-only), by
// path otherwise. An object removed while open with no handle here (a
// directory, a FIFO) keeps its last known attributes, with no link left,
// as on ext4.
func (n *node) stat(f fusefs.FileHandle) (unix.Stat_t, error) {
	var st unix.Stat_t
	if h, ok := f.(fileHandle); ok {
		hh := h.h()
		hh.switchToUpper()
		hh.mu.RLock()
		err := unix.Fstat(hh.fd, &st)
		upper := hh.upper
		hh.mu.RUnlock()
		if _, reachable := n.rel(); err == nil && !upper && !reachable {
			st.Nlink = 0 // unlinked in the sandbox; the original keeps its link
		}
		return st, err
	}
	rel, fd, errno := n.target()
	var err error
	switch {
	case errno != 0:
		n.mu.Lock()
		st, ok := n.last.stat()
		n.mu.Unlock()
		if !ok {
			return st, errno
		}
		orphaned(&st)
		return st, nil
	case fd >= 0:
		err = unix.Fstat(fd, &st)
	default:
		st, err = n.fs.layers.Stat(rel, n.getObj())
	}
	if err == nil {
		n.mu.Lock()
		n.last = keepAttrs(&st)
		n.mu.Unlock()
	}
	return st, err
}

var _ = (fusefs.NodeSetattrer)((*node)(nil))

func (n *node) Setattr(ctx context.Context, f fusefs.FileHandle, in *gofuse.SetAttrIn, out *gofuse.AttrOut) syscall.Errno {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	st, errno := n.setattr(ctx, f, in)
	if errno != 0 {
		return errno
	}
	fillAttr(&out.Attr, &st, n.StableAttr().Ino)
	if n.reissueHere() {
		// With the original's number: the kernel may not keep them
		// (a zero timeout), so the next stat meets stale.
		return 0
	}
	// The attributes are fresh: the kernel may keep them as long as those
	// of a GETATTR (go-fuse leaves a SETATTR reply at 0, which made the
	// next stat of the object a round trip).
	out.SetTimeout(n.fs.attrTimeout)
	return 0
}

// setattr makes the change in (through f when it is an upper handle) and
// returns the attributes after it. The caller holds the freeze gate.
func (n *node) setattr(ctx context.Context, f fusefs.FileHandle, in *gofuse.SetAttrIn) (unix.Stat_t, syscall.Errno) {
	rel, fd, errno := n.mutableTarget()
	if h, ok := f.(fileHandle); ok && h.h().upper {
		fd, errno = h.h().fd, 0
	}
	a := toSetAttr(in)
	if a.Mode == nil && killsPrivileges(in) && n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFDIR {
		st, err := n.stat(f)
		if err != nil {
			return st, n.fs.toErrno("setattr", err)
		}
		if m, ok := withoutPrivileges(&st, caller(ctx)); ok {
			a.Mode = &m
		}
	}
	if errno != 0 {
		return n.setattrOrphan(a, errno)
	}
	n.mu.Lock()
	st, err := n.fs.layers.Setattr(rel, &n.obj, fd, a, caller(ctx))
	if err == nil {
		// What an fstat answers once the object is removed while open:
		// the kernel may keep these attributes without asking again.
		n.last = keepAttrs(&st)
	}
	n.mu.Unlock()
	if err != nil {
		return st, n.fs.toErrno("setattr", err)
	}
	return st, 0
}

// setattrOrphan is setattr for an object removed while open that no
// handle of this server reaches: a FIFO or device node open in some
// process, a directory removed while open (FUSE sends no OPEN for the
// first and sbxfs takes none for the second). On ext4 its inode lives on
// for whoever holds it, and fchmod, fchown and futimens on it work; here
// nothing of it is left in the upper layer, so the change is made to the
// attributes the node keeps for it (stat answers those), with the ctime
// of now. Nothing is recorded: no name leads to it, and it is gone once
// closed. errno is returned when the node has no attributes to change,
// or for a size (only regular files have one to change, and the kernel
// refuses a truncate of anything else).
func (n *node) setattrOrphan(a layers.SetAttr, errno syscall.Errno) (unix.Stat_t, syscall.Errno) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.last.stat()
	if !ok || a.Size != nil {
		return unix.Stat_t{}, errno
	}
	now := time.Now()
	stamp := func(t *unix.Timespec) unix.Timespec {
		if t.Nsec == unix.UTIME_NOW {
			return unix.NsecToTimespec(now.UnixNano())
		}
		return *t
	}
	if a.Mode != nil {
		st.Mode = st.Mode&syscall.S_IFMT | *a.Mode&0o7777
	}
	if a.Uid != nil {
		st.Uid = *a.Uid
	}
	if a.Gid != nil {
		st.Gid = *a.Gid
	}
	if a.Atime != nil { // timeArg gives a time or UTIME_NOW, never UTIME_OMIT
		st.Atim = stamp(a.Atime)
	}
	if a.Mtime != nil {
		st.Mtim = stamp(a.Mtime)
	}
	if a.Mode != nil || a.Uid != nil || a.Gid != nil || a.Atime != nil || a.Mtime != nil {
		st.Ctim = unix.NsecToTimespec(now.UnixNano())
	}
	orphaned(&st)
	n.last = keepAttrs(&st)
	return st, 0
}

// orphaned makes st the attributes of an object removed while open, as
// ext4 gives them: no link left (a directory rmdir removed was emptied
// then: emptied).
func orphaned(st *unix.Stat_t) {
	st.Nlink = 0
}

func toSetAttr(in *gofuse.SetAttrIn) layers.SetAttr {
	var a layers.SetAttr
	if m, ok := in.GetMode(); ok {
		a.Mode = &m
	}
	if u, ok := in.GetUID(); ok {
		a.Uid = &u
	}
	if g, ok := in.GetGID(); ok {
		a.Gid = &g
	}
	if s, ok := in.GetSize(); ok {
		a.Size = &s
	}
	a.Atime = timeArg(in.Valid&gofuse.FATTR_ATIME != 0, in.Valid&gofuse.FATTR_ATIME_NOW != 0, in.Atime, in.Atimensec)
	a.Mtime = timeArg(in.Valid&gofuse.FATTR_MTIME != 0, in.Valid&gofuse.FATTR_MTIME_NOW != 0, in.Mtime, in.Mtimensec)
	return a
}

func timeArg(set, now bool, sec uint64, nsec uint32) *unix.Timespec {
	switch {
	case !set:
		return nil
	case now:
		return &unix.Timespec{Nsec: unix.UTIME_NOW}
	}
	return &unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
}

var _ = (fusefs.NodeReadlinker)((*node)(nil))

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	defer n.fs.names.shared()()
	rel, ok := n.rel()
	if !ok {
		return nil, syscall.ENOENT
	}
	t, err := n.fs.layers.Readlink(rel, n.getObj())
	if err != nil {
		return nil, n.fs.toErrno("readlink", err)
	}
	return []byte(t), 0
}

var _ = (fusefs.NodeStatfser)((*node)(nil))

func (n *node) Statfs(ctx context.Context, out *gofuse.StatfsOut) syscall.Errno {
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.fs.layers.UpperDir(), &st); err != nil {
		return n.fs.toErrno("statfs", err)
	}
	out.FromStatfsT(&st)
	return 0
}
