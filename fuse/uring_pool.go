package fuse

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ring threads of the process: one a possible CPU, pinned to it, made
// when a mount first needs it and kept for the life of the process. Every
// io_uring mount of the process registers its queue of CPU c on the ring
// of thread c, so a process serving many mounts keeps as many threads as
// the machine has CPUs, not CPUs x mounts (docs/design.md, "Transport").
// A thread answers one request at a time, for whichever mount sent it;
// requests that may wait are answered on goroutines (uringQueue.mayWait),
// and so is every request of a mount whose layers are themselves on FUSE,
// which could be a mount of this very process served by the same thread,
// or on a network filesystem, whose server could stall the thread.

const (
	// ringSQ is the submission slots of a ring: a batch that fills it is
	// submitted early (ringThread.sqe).
	ringSQ = 64
	// ringCQ is the completion slots: more than one a mount's entries
	// for the mounts a process usually serves; beyond it the kernel
	// keeps completions until there is room.
	ringCQ = 1024

	// trimEvery is how often the ring threads give back the payload
	// pages of entries that took a large request or reply and have been
	// idle since the last time.
	trimEvery = 5 * time.Second

	wakeUserData   = ^uint64(0)     // the read of the thread's eventfd
	refuseUserData = ^uint64(0) - 1 // a registration meant to be refused
)

var ringThreads struct {
	mu  sync.Mutex
	cpu []*ringThread // by CPU; nil until made
}

// ringThreadFor returns the ring thread of cpu, making it first if need
// be. A thread that cannot be made is tried again at the next mount.
func ringThreadFor(cpu int) (*ringThread, error) {
	ringThreads.mu.Lock()
	defer ringThreads.mu.Unlock()
	if cpu >= len(ringThreads.cpu) {
		ringThreads.cpu = append(ringThreads.cpu, make([]*ringThread, cpu+1-len(ringThreads.cpu))...)
	}
	if th := ringThreads.cpu[cpu]; th != nil {
		return th, nil
	}
	trimmer.Do(func() { go trimLoop() })
	th := &ringThread{cpu: cpu, wake: -1, queues: map[*uringQueue]struct{}{}}
	made := make(chan error)
	go th.run(made)
	if err := <-made; err != nil {
		return nil, err
	}
	ringThreads.cpu[cpu] = th
	return th, nil
}

// ringThread owns one ring. Everything but post runs on the thread.
type ringThread struct {
	cpu   int
	r     *ring
	wake  int    // eventfd: work posted from other goroutines
	wakeB []byte // the eventfd read's buffer, outside the Go heap
	woken bool   // the eventfd read completed: drain the inbox

	ents   []*uringEnt // by user data; nil: a free slot
	free   []uint64
	queues map[*uringQueue]struct{} // registered here, until they end

	dirty atomic.Int64 // entries with payload pages to give back (trim)

	mu    sync.Mutex
	inbox []func()
}

// run is the thread: it makes the ring, then waits for completions and
// the work posted to it, forever.
func (th *ringThread) run(made chan<- error) {
	runtime.LockOSThread() // the ring belongs to this thread; never unlocked
	var set unix.CPUSet
	set.Set(th.cpu)
	_ = unix.SchedSetaffinity(0, &set) // an offline CPU: run anywhere
	// Named for ps -L and top -H (at most 15 bytes).
	if name, err := unix.BytePtrFromString(fmt.Sprintf("sbxfs-ring%d", th.cpu)); err == nil {
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
	}
	if err := th.setup(); err != nil {
		made <- err
		return // the thread ends with its locked goroutine
	}
	made <- nil
	th.armWake()
	for {
		err := th.r.enter(1)
		th.r.completions(th.handle)
		// Work posted may complete more (a registration handles the
		// completions it causes, which may be another wake-up): drain
		// until none is left before waiting again.
		for th.woken {
			th.woken = false
			th.drain()
		}
		if err != nil {
			// Nothing the thread can do about it; the completions
			// that are there were handled.
			runtime.Gosched()
		}
	}
}

func (th *ringThread) setup() error {
	r, err := newRing(ringSQ, ringCQ)
	if err != nil {
		return err
	}
	mem, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		r.close()
		return fmt.Errorf("io_uring: eventfd buffer: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		unix.Munmap(mem)
		r.close()
		return fmt.Errorf("io_uring: eventfd: %w", err)
	}
	th.r, th.wakeB, th.wake = r, mem[:8], wake
	return nil
}

// handle is called for every completion of the ring.
func (th *ringThread) handle(ud uint64, res int32) {
	switch ud {
	case wakeUserData:
		th.woken = true
		th.armWake()
		return
	case refuseUserData:
		return
	}
	if ud >= uint64(len(th.ents)) || th.ents[ud] == nil {
		return // not ours: an entry has one command in the kernel at a time
	}
	e := th.ents[ud]
	if res < 0 {
		th.ents[ud] = nil
		th.free = append(th.free, ud)
		e.q.entryGone(res)
		return
	}
	e.q.serve(e)
}

func (th *ringThread) armWake() {
	putRead(th.sqe(), th.wake, th.wakeB, wakeUserData)
}

// sqe returns a submission entry to fill in, submitting what is filled in
// already if the ring has no free one.
func (th *ringThread) sqe() []byte {
	s := th.r.sqe()
	for s == nil {
		_ = th.r.enter(0)
		s = th.r.sqe()
	}
	return s
}

// add gives e a user data number on this ring.
func (th *ringThread) add(e *uringEnt) uint64 {
	if n := len(th.free); n > 0 {
		ud := th.free[n-1]
		th.free = th.free[:n-1]
		th.ents[ud] = e
		return ud
	}
	th.ents = append(th.ents, e)
	return uint64(len(th.ents) - 1)
}

// post has fn run on the thread, soon. It may be called from anywhere but
// the thread itself.
func (th *ringThread) post(fn func()) {
	th.mu.Lock()
	th.inbox = append(th.inbox, fn)
	th.mu.Unlock()
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(th.wake, one[:])
}

// do runs fn on the thread and returns once it has run.
func (th *ringThread) do(fn func()) {
	done := make(chan struct{})
	th.post(func() { fn(); close(done) })
	<-done
}

func (th *ringThread) drain() {
	th.mu.Lock()
	fns := th.inbox
	th.inbox = nil
	th.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// refuse makes the kernel give up io_uring for the connection of devFd:
// a registration it refuses (a queue that does not exist) does that, and
// the kernel refuses it as it is submitted. Run on the thread.
func (th *ringThread) refuse(devFd int) error {
	var iov [2]unix.Iovec // not read: the queue number is checked first
	s := th.sqe()
	putUringCmd(s, devFd, fuseIOUringCmdRegister, &iov[0], 2, refuseUserData)
	binary.LittleEndian.PutUint16(s[48+16:], 0xffff)
	err := th.r.enter(0)
	th.r.completions(th.handle)
	return err
}

var trimmer sync.Once

// trimLoop has every ring thread with large payloads resident give them
// back, every trimEvery, for the life of the process.
func trimLoop() {
	for range time.Tick(trimEvery) {
		ringThreads.mu.Lock()
		ths := slices.Clone(ringThreads.cpu)
		ringThreads.mu.Unlock()
		for _, th := range ths {
			if th != nil && th.dirty.Load() > 0 {
				th.post(th.trim)
			}
		}
	}
}

// trim gives the kernel back the payload pages (all but the first) of
// every entry that took a request or reply of more than a page and none
// since the last trim: a READ of 1 MiB leaves 1 MiB resident in the entry
// that answered it, which would stay, for every entry of every CPU of
// every mount, in a process that serves many. The kernel writes an entry
// only from this thread (task work run while it waits in io_uring_enter),
// and an entry answered on a goroutine is skipped, so nothing writes a
// buffer while it is given back; the pages come back zeroed when the
// next large request is written in.
func (th *ringThread) trim() {
	page := os.Getpagesize()
	for q := range th.queues {
		for i := range q.ents {
			e := &q.ents[i]
			if e.dirty && !e.recent && !e.busy {
				_ = unix.Madvise(e.payload[page:], unix.MADV_DONTNEED)
				e.dirty = false
				th.dirty.Add(-1)
			}
			e.recent = false
		}
	}
}
