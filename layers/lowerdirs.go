package layers

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A lower read opens the directory of its object beneath the layer's root
// (lowerfs.go): openat2 walks the path and close gives the descriptor
// back, two system calls more than a read by path. The serving process
// reads in bursts (`ls -l` of a directory: a LOOKUP and two attribute
// reads a file, all in one directory), so it keeps the directories it
// opened for a short while (HoldLowerDirs) and reads the next object
// there through the same descriptor: cold `stat` of 20,000 original files
// ~9 % faster, cold `ls -lR` ~11 % (docs/design.md, "The original is read
// through descriptors"; BenchmarkLowerLookup).
//
// A held directory is the one the path led to when it was opened. Should
// another process replace it in the original (rename another directory
// over it, remove it and make a new one) the reads through the mount go
// on in the old one until the hold expires: what kernel overlayfs does
// for as long as it keeps the directory's dentry, and what the kernel's
// own entry cache (30 s by default) does for names it has looked up.
// Nothing beyond the original is reachable through a held directory: it
// was opened beneath the layer's root without following a symlink, and a
// directory moved out of the original shows only what it held.
//
// Change-set reads never hold (layers.Changes opens a stack of its own):
// there a directory swapped while the read runs must be seen
// (checkDirs).

// heldDirsMax bounds the descriptors a stack holds at once.
const heldDirsMax = 256

// heldOpen counts the descriptors the held directories of every stack of
// this process keep open. heldBudget caps it at an eighth of the
// process's descriptor limit: a daemon serving many busy sandboxes keeps
// room for the descriptors its work needs (a variable for the tests).
var (
	heldOpen   atomic.Int64
	heldBudget = sync.OnceValue(func() int64 {
		var rl unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			return 128
		}
		return int64(min(rl.Cur, 1<<20) / 8)
	})
)

type heldDirKey struct {
	layer int
	path  string // layer-relative, "." for the root
}

type heldDir struct {
	fd     int
	refs   int  // reads using fd now
	gone   bool // dropped from the map: close at the last release
	opened time.Time
}

// heldDirs is the cache of lower directories (nil: none are held).
type heldDirs struct {
	ttl   time.Duration
	mu    sync.Mutex
	m     map[heldDirKey]*heldDir
	sweep *time.Timer // pending while the map holds descriptors
}

// HoldLowerDirs makes lower reads keep the directories they open for ttl
// (0: none kept, the default). For the serving process; call it once,
// before the first read.
func (l *Layers) HoldLowerDirs(ttl time.Duration) {
	if ttl > 0 {
		l.held = &heldDirs{ttl: ttl, m: make(map[heldDirKey]*heldDir)}
	}
}

// dirRef is a directory descriptor lent to one lower read: release it.
type dirRef struct {
	fd int
	h  *heldDir // nil: the read's own descriptor
}

// get returns the held directory k, if one is fresh, counted as in use.
func (c *heldDirs) get(k heldDirKey) *heldDir {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.m[k]
	if h == nil {
		return nil
	}
	if time.Since(h.opened) >= c.ttl {
		c.dropLocked(k, h)
		return nil
	}
	h.refs++
	return h
}

// put holds fd, just opened, as the directory k, counted as in use. It
// reports nil when fd is not held (the cache dropped, or the process's
// budget spent), and then the caller keeps fd as its own.
func (c *heldDirs) put(k heldDirKey, fd int) *heldDir {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		return nil
	}
	if old := c.m[k]; old != nil {
		c.dropLocked(k, old) // a read raced this one to open it: the later wins
	}
	if len(c.m) >= heldDirsMax || heldOpen.Load() >= heldBudget() {
		c.expireLocked(true)
		if heldOpen.Load() >= heldBudget() {
			return nil
		}
	}
	h := &heldDir{fd: fd, refs: 1, opened: time.Now()}
	heldOpen.Add(1)
	c.m[k] = h
	if c.sweep == nil {
		c.sweep = time.AfterFunc(c.ttl, c.expire)
	}
	return h
}

// release gives back a descriptor get or put lent.
func (c *heldDirs) release(h *heldDir) {
	c.mu.Lock()
	h.refs--
	last := h.gone && h.refs == 0
	c.mu.Unlock()
	if last {
		h.close()
	}
}

// close closes a held directory no read uses any more.
func (h *heldDir) close() {
	unix.Close(h.fd)
	heldOpen.Add(-1)
}

// dropLocked takes h, held as k, out of the map; its descriptor closes
// now, or at the release of the last read using it.
func (c *heldDirs) dropLocked(k heldDirKey, h *heldDir) {
	delete(c.m, k)
	h.gone = true
	if h.refs == 0 {
		h.close()
	}
}

// expireLocked drops the expired directories; with room, at least one
// (the map is full or the budget spent).
func (c *heldDirs) expireLocked(room bool) {
	n := len(c.m)
	for k, h := range c.m {
		if time.Since(h.opened) >= c.ttl {
			c.dropLocked(k, h)
		}
	}
	if room && len(c.m) == n {
		for k, h := range c.m {
			c.dropLocked(k, h)
			break
		}
	}
}

// expire runs from the timer put arms: an idle server holds nothing for
// longer than about twice the ttl.
func (c *heldDirs) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked(false)
	c.sweep = nil
	if len(c.m) > 0 {
		c.sweep = time.AfterFunc(c.ttl, c.expire)
	}
}

// drop lets every held directory go; with closed, for good (Close).
func (c *heldDirs) drop(closed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, h := range c.m {
		c.dropLocked(k, h)
	}
	if closed {
		c.m = nil
		if c.sweep != nil {
			c.sweep.Stop()
			c.sweep = nil
		}
	}
}

// dropHeldDirs lets the held directories go (the original changed).
func (l *Layers) dropHeldDirs() {
	if l.held != nil {
		l.held.drop(false)
	}
}
