package fuse

import (
	"cmp"
	"encoding/binary"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// FUSE over io_uring (Linux 6.14+, docs/design.md "Transport"). After INIT
// the server registers, for every possible CPU, a few ring entries (a
// header buffer and a payload buffer each) with the kernel. A request is
// then put in an entry of the queue of the CPU the caller runs on, and the
// reply goes back with the command that fetches the next request: one
// system call a request instead of a read and a write on /dev/fuse, and the
// ring thread of that CPU (uring_pool.go, shared by the process's mounts),
// pinned to it, runs where the caller waits instead of being woken on
// another CPU. Setting it up: uring_setup.go. FORGET and INTERRUPT still
// come through /dev/fuse, where go-fuse's own loop keeps reading; so do
// the requests of the few moments before every queue is registered.
//
// go-fuse has no io_uring transport; its ProtocolServer turns one request
// (as byte slices) into RawFileSystem calls and one reply, and this file
// moves the bytes.

const (
	fuseIOUringCmdRegister       = 1
	fuseIOUringCmdCommitAndFetch = 2

	// struct fuse_uring_req_header: in_out[128], op_in[128], then
	// struct fuse_uring_ent_in_out {flags, commit_id u64; payload_sz u32}.
	uringOpIn       = 128
	uringCommitID   = 264
	uringPayloadSz  = 272
	uringHeaderSize = 288

	inHeaderSize  = int(unsafe.Sizeof(gofuse.InHeader{}))
	outHeaderSize = 16

	// uringEntries is the number of entries a queue registers. The queue's
	// thread answers one request at a time; the others wait in the ring, so
	// the kernel never waits for a free entry.
	uringEntries = 4

	opLookup   = 1  // FUSE_LOOKUP
	opRead     = 15 // FUSE_READ
	opWrite    = 16 // FUSE_WRITE
	opFsync    = 20 // FUSE_FSYNC
	opFsyncdir = 30 // FUSE_FSYNCDIR

	// asyncReadSize is the least READ answered off the queue's thread.
	asyncReadSize = 64 << 10
)

// uringEnt is one registered entry: its buffers live outside the Go heap
// (the kernel writes them while no system call of ours is running).
type uringEnt struct {
	q       *uringQueue
	ud      uint64 // its number on the ring (ringThread.add)
	hdr     []byte
	payload []byte
	scratch []byte // a copy of the request's names, which the reply overwrites
	iov     [2]unix.Iovec

	used int // payload bytes the last request or its reply took (answer)
	// On the ring thread (trim):
	busy   bool // answered on a goroutine, not committed yet
	dirty  bool // payload pages beyond the first are resident
	recent bool // dirtied since the last trim
}

// uringQueue is one mount's queue of one CPU, served by that CPU's ring
// thread (uring_pool.go).
type uringQueue struct {
	t    *uringTransport
	qid  int
	th   *ringThread
	mem  []byte
	ents []uringEnt

	// On the ring thread:
	live    int   // entries the kernel holds or we answer
	refused error // why the kernel took an entry back, if it did
}

// uringTransport is the io_uring side of one mount.
type uringTransport struct {
	fs      *filesystem
	ps      *gofuse.ProtocolServer
	devFd   int // our duplicate of the mount's /dev/fuse descriptor
	payload int // bytes of an entry's payload buffer
	queues  []*uringQueue
	nqueues int // one a possible CPU
	wg      sync.WaitGroup
	served  atomic.Uint64
	active  bool // every queue registered: the kernel uses the rings
	// offThread answers every request on a goroutine: the layers are on
	// FUSE, maybe a mount of this process whose requests from this CPU
	// the same ring thread serves (a sandbox nested in another), or on a
	// network filesystem, whose server may stop answering: the thread
	// would then hold up every mount's requests from its CPU.
	offThread bool
}

// wait waits for every queue to end (they end when the kernel tears the
// rings down at unmount and has given every entry back).
func (t *uringTransport) wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() { t.wg.Wait(); close(done) }()
	select {
	case <-done:
		unix.Close(t.devFd)
		return true
	case <-time.After(d):
		return false
	}
}

// entryGone takes note of an entry the kernel gave back (res < 0): refused
// at registration, or the connection is gone. The queue ends with its last
// entry. On the ring thread.
func (q *uringQueue) entryGone(res int32) {
	q.live--
	q.refused = cmp.Or(q.refused, error(syscall.Errno(-res)))
	if q.live == 0 {
		delete(q.th.queues, q)
		for i := range q.ents {
			if q.ents[i].dirty {
				q.th.dirty.Add(-1)
			}
		}
		q.free()
		q.t.wg.Done()
	}
}

func (q *uringQueue) submit(e *uringEnt, cmd uint32, commitID uint64, qid uint16) {
	s := q.th.sqe()
	putUringCmd(s, q.t.devFd, cmd, &e.iov[0], 2, e.ud)
	binary.LittleEndian.PutUint64(s[48+8:], commitID)
	binary.LittleEndian.PutUint16(s[48+16:], qid)
}

// serve answers the request in e on the ring thread, or on a goroutine
// when it may take long or wait: then the thread's other requests go on
// meanwhile (mayWait).
func (q *uringQueue) serve(e *uringEnt) {
	if !q.mayWait(e) {
		q.answer(e)
		q.commit(e)
		return
	}
	e.busy = true
	go func() {
		q.answer(e)
		q.th.post(func() { q.commit(e) })
	}()
}

// mayWait tells the requests answered off the ring thread: every one of a
// mount whose layers are on FUSE or a network filesystem (offThread), and
// those the filesystem says may wait (filesystem.mayWait).
func (q *uringQueue) mayWait(e *uringEnt) bool {
	if q.t.offThread {
		return true
	}
	h := e.hdr
	return q.t.fs.mayWait(binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint32(h[uringOpIn+16:]))
}

// mayWait tells the requests a transport answers on a goroutine rather
// than on the thread that took them: every one while a commit has the
// sandbox frozen (a mutating request waits at the gate, and must not hold
// up the RELEASE the freeze waits for); large READs, which wait for the
// disk when they read an original file (the kernel's readahead sends
// several at once, and they must reach the disk together); and FSYNC,
// which waits for the disk. readSize is fuse_read_in.size of a READ.
func (fs *filesystem) mayWait(opcode, readSize uint32) bool {
	switch opcode {
	case opRead:
		if readSize >= asyncReadSize {
			return true
		}
	case opFsync, opFsyncdir:
		return true
	}
	if fs.gate.mu.TryRLock() {
		fs.gate.mu.RUnlock()
		return false
	}
	return true
}

func (q *uringQueue) commit(e *uringEnt) {
	e.busy = false
	if e.used > os.Getpagesize() {
		if !e.dirty {
			q.th.dirty.Add(1)
		}
		e.dirty, e.recent = true, true
	}
	q.submit(e, fuseIOUringCmdCommitAndFetch, binary.LittleEndian.Uint64(e.hdr[uringCommitID:]), uint16(q.qid))
}

// answer turns the request in entry e into the classic byte stream (in
// header, operation header, payload), has the ProtocolServer run it, and
// leaves the reply as the kernel wants it: the out header in the entry's
// header, everything after it in the payload.
func (q *uringQueue) answer(e *uringEnt) {
	h := e.hdr
	length := int(binary.LittleEndian.Uint32(h[0:]))
	opcode := binary.LittleEndian.Uint32(h[4:])
	unique := binary.LittleEndian.Uint64(h[8:])
	psz := int(binary.LittleEndian.Uint32(h[uringPayloadSz:]))
	opsz := length - inHeaderSize - psz
	if opsz < 0 || opsz > uringOpIn || psz > len(e.payload) {
		q.replyErr(e, unique, syscall.EIO)
		return
	}
	e.used = psz
	payload := e.payload[:psz]
	if opcode != opWrite && psz > 0 {
		// Names and xattr values: copied, as replies are written into
		// the same buffer. WRITE data is used in place (a WRITE's reply
		// is written after the data is).
		if cap(e.scratch) < psz {
			e.scratch = make([]byte, max(psz, 256))
		}
		payload = e.scratch[:psz]
		copy(payload, e.payload)
	}
	in := [][]byte{h[:inHeaderSize], h[uringOpIn : uringOpIn+opsz], payload}
	n, st := q.t.ps.HandleRequest(in, [][]byte{h[:outHeaderSize], e.payload})
	if !st.Ok() || n < outHeaderSize {
		q.replyErr(e, unique, syscall.EIO)
		return
	}
	binary.LittleEndian.PutUint32(h[uringPayloadSz:], uint32(n-outHeaderSize))
	e.used = max(e.used, n-outHeaderSize)
	q.t.served.Add(1)
}

func (q *uringQueue) replyErr(e *uringEnt, unique uint64, errno syscall.Errno) {
	h := e.hdr
	binary.LittleEndian.PutUint32(h[0:], outHeaderSize)
	binary.LittleEndian.PutUint32(h[4:], uint32(-int32(errno)))
	binary.LittleEndian.PutUint64(h[8:], unique)
	binary.LittleEndian.PutUint32(h[uringPayloadSz:], 0)
}
