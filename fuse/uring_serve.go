package fuse

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
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
// server thread of that queue, pinned to the CPU, runs where the caller
// waits instead of being woken on another CPU. FORGET and INTERRUPT still
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

	opRead     = 15 // FUSE_READ
	opWrite    = 16 // FUSE_WRITE
	opFsync    = 20 // FUSE_FSYNC
	opFsyncdir = 30 // FUSE_FSYNCDIR

	// asyncReadSize is the least READ answered off the queue's thread.
	asyncReadSize = 64 << 10
)

// uringFault, from SBXFS_URING_FAULT, makes the io_uring start fail on
// purpose, for the tests of the fallback (TestIOUringFallsBack): "setup"
// fails the ring of the last queue, "all" every ring, "register" has the
// last queue's registration refused by the kernel.
var uringFault = os.Getenv("SBXFS_URING_FAULT")

// uringEnabled reports whether the kernel lets FUSE servers use io_uring
// (the fuse module's enable_uring parameter, off by default) and whether
// this process may make rings (kernel.io_uring_disabled, seccomp).
func uringEnabled() bool {
	b, err := os.ReadFile("/sys/module/fuse/parameters/enable_uring")
	if err != nil || strings.TrimSpace(string(b)) != "Y" {
		return false
	}
	uringProbe.Do(func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		r, err := newRing(2, 0)
		if err == nil {
			r.close()
		}
		uringProbeOK = err == nil
	})
	return uringProbeOK
}

var (
	uringProbe   sync.Once
	uringProbeOK bool
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

// startURing registers the ring queues of srv's connection, which
// negotiated FUSE_OVER_IO_URING in INIT. It returns once every queue is
// registered (the kernel sends requests through the rings from then on) or
// has failed; on failure the kernel goes on with /dev/fuse, and the
// transport it may still return (not active) has queues to wait for.
func startURing(fs *filesystem, raw gofuse.RawFileSystem, srv *gofuse.Server, opts *gofuse.MountOptions) (*uringTransport, error) {
	devFd, err := fuseDevFd(srv)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errURingStuck, err)
	}
	t := &uringTransport{fs: fs, devFd: devFd, ps: gofuse.NewProtocolServer(raw, opts), offThread: fs.layersMayStall}
	pages := (opts.MaxWrite-1)/os.Getpagesize() + 1
	t.payload = max(pages*os.Getpagesize(), 8192, opts.MaxWrite)
	ncpu, err := possibleCPUs()
	if err != nil {
		unix.Close(devFd)
		return nil, fmt.Errorf("%w: %v", errURingStuck, err)
	}
	// Every queue gets its CPU's ring thread and its buffers, then all
	// register: the kernel uses the rings only once every queue has an
	// entry, and a registration that fails turns io_uring off for the
	// connection.
	t.nqueues = ncpu
	var failed error
	var some *ringThread // a ring to turn io_uring off with
	for qid := range ncpu {
		th, err := ringThreadFor(qid)
		if uringFault == "all" || uringFault == "setup" && qid == ncpu-1 {
			th, err = nil, errors.New("io_uring: ring setup failed (SBXFS_URING_FAULT)")
		}
		if err != nil {
			failed = cmp.Or(failed, err)
			continue
		}
		some = cmp.Or(some, th)
		if failed == nil {
			q, err := t.newQueue(qid, th)
			if err != nil {
				failed = err
				continue
			}
			t.queues = append(t.queues, q)
		}
	}
	if failed == nil {
		failed = t.init(srv.KernelSettings())
	}
	if failed != nil {
		for _, q := range t.queues {
			q.free()
		}
		defer unix.Close(devFd)
		var err error
		if some != nil {
			some.do(func() { err = some.refuse(devFd) })
		} else {
			err = refuseOnOwnRing(devFd)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v; %v", errURingStuck, failed, err)
		}
		return nil, failed
	}
	registered := make(chan error, ncpu)
	for _, q := range t.queues {
		t.wg.Add(1)
		q.th.post(func() { registered <- q.register() })
	}
	for range t.queues {
		failed = cmp.Or(failed, <-registered)
	}
	if failed != nil {
		return t, failed // the kernel serves through /dev/fuse; queues end at unmount
	}
	t.active = true
	return t, nil
}

// errURingStuck says io_uring was negotiated but no ring could be made to
// register or to turn it off with: the kernel holds every request of the
// mount, which must be unmounted.
var errURingStuck = errors.New("io_uring negotiated but unusable")

// init hands the kernel's INIT to the ProtocolServer, which negotiates as
// the mount's server did (same options, same flags).
func (t *uringTransport) init(k *gofuse.InitIn) error {
	in := *k // go-fuse's in structs start with the in header
	in.InHeader = gofuse.InHeader{Length: uint32(unsafe.Sizeof(in)), Opcode: 26, Unique: 1}
	req := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))
	out := make([]byte, 4096)
	n, st := t.ps.HandleRequest([][]byte{req}, [][]byte{out})
	if !st.Ok() || n < outHeaderSize || binary.LittleEndian.Uint32(out[4:]) != 0 {
		return fmt.Errorf("io_uring: INIT: %v, error %d", st, int32(binary.LittleEndian.Uint32(out[4:])))
	}
	return nil
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

// newQueue maps the buffers of the queue of CPU qid.
func (t *uringTransport) newQueue(qid int, th *ringThread) (*uringQueue, error) {
	hdrPage := os.Getpagesize()
	per := hdrPage + t.payload
	mem, err := unix.Mmap(-1, 0, uringEntries*per, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("io_uring: buffers: %w", err)
	}
	q := &uringQueue{t: t, qid: qid, th: th, mem: mem, ents: make([]uringEnt, uringEntries)}
	for i := range q.ents {
		e := &q.ents[i]
		base := i * per
		e.q = q
		e.hdr = mem[base : base+uringHeaderSize]
		e.payload = mem[base+hdrPage : base+per]
		e.iov[0] = unix.Iovec{Base: &e.hdr[0]}
		e.iov[0].SetLen(uringHeaderSize)
		e.iov[1] = unix.Iovec{Base: &e.payload[0]}
		e.iov[1].SetLen(len(e.payload))
	}
	return q, nil
}

func (q *uringQueue) free() {
	if q.mem != nil {
		unix.Munmap(q.mem)
		q.mem = nil
	}
}

// refuseOnOwnRing turns io_uring off for the connection when no ring
// thread could be made to do it with.
func refuseOnOwnRing(devFd int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := newRing(2, 0)
	if err != nil {
		return err
	}
	defer r.close()
	var iov [2]unix.Iovec // not read: the queue number is checked first
	s := r.sqe()
	putUringCmd(s, devFd, fuseIOUringCmdRegister, &iov[0], 2, 0)
	binary.LittleEndian.PutUint16(s[48+16:], 0xffff)
	if err := r.enter(1); err != nil {
		return err
	}
	r.completions(func(uint64, int32) {})
	return nil
}

// register hands the queue's entries to the kernel, on the ring thread.
// The kernel answers a registration only when it sends the entry a
// request, so a refusal shows now and success later, as a request. It
// fails when no entry was taken; a queue that has some serves with those.
func (q *uringQueue) register() error {
	qid := uint16(q.qid)
	if uringFault == "register" && q.qid == q.t.nqueues-1 {
		qid = 0xffff // a queue the kernel does not have
	}
	q.live = len(q.ents)
	q.th.queues[q] = struct{}{}
	for i := range q.ents {
		e := &q.ents[i]
		e.ud = q.th.add(e)
		q.submit(e, fuseIOUringCmdRegister, 0, qid)
	}
	err := q.th.r.enter(0)
	q.th.r.completions(q.th.handle) // refusals, and other mounts' requests
	if q.refused != nil && q.live == 0 {
		return fmt.Errorf("io_uring: register queue %d: %w", q.qid, q.refused)
	}
	return err
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
// mount whose layers are on FUSE or a network filesystem (offThread); every one while a commit has
// the sandbox frozen (a mutating request waits at the gate, and must not
// hold up the RELEASE the freeze waits for); large READs, which wait for
// the disk when they read an original file (the kernel's readahead sends
// several at once, and they must reach the disk together, as on
// /dev/fuse); and FSYNC, which waits for the disk.
func (q *uringQueue) mayWait(e *uringEnt) bool {
	if q.t.offThread {
		return true
	}
	h := e.hdr
	switch binary.LittleEndian.Uint32(h[4:]) {
	case opRead:
		if binary.LittleEndian.Uint32(h[uringOpIn+16:]) >= asyncReadSize { // fuse_read_in.size
			return true
		}
	case opFsync, opFsyncdir:
		return true
	}
	if q.t.fs.gate.mu.TryRLock() {
		q.t.fs.gate.mu.RUnlock()
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

// fuseDevFd returns a duplicate of the /dev/fuse descriptor of srv.
// go-fuse does not export it; it is read from the Server's fuseFD.conn (a
// syscall.RawConn) with reflection, and TestIOUringServes fails if a
// go-fuse upgrade moves it.
func fuseDevFd(srv *gofuse.Server) (int, error) {
	v := reflect.ValueOf(srv).Elem().FieldByName("fuseFD")
	if !v.IsValid() || v.Kind() != reflect.Pointer || v.IsNil() {
		return -1, errors.New("io_uring: go-fuse's Server has no fuseFD field")
	}
	c := v.Elem().FieldByName("conn")
	if !c.IsValid() || c.Type() != reflect.TypeFor[syscall.RawConn]() {
		return -1, errors.New("io_uring: go-fuse's fuseFD has no conn field")
	}
	conn := *(*syscall.RawConn)(unsafe.Pointer(c.UnsafeAddr()))
	fd, derr := -1, error(nil)
	if err := conn.Control(func(raw uintptr) {
		fd, derr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("io_uring: dup /dev/fuse: %w", derr)
	}
	return fd, nil
}

// possibleCPUs is the number of the kernel's queues: one per possible CPU.
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	last := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		_, hi, _ := strings.Cut(part, "-")
		if hi == "" {
			hi = part
		}
		n, err := strconv.Atoi(hi)
		if err != nil {
			return 0, fmt.Errorf("cpu/possible %q: %w", b, err)
		}
		last = max(last, n)
	}
	return last + 1, nil
}
