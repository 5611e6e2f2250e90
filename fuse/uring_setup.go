package fuse

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// Setting FUSE over io_uring up for a mount (uring_serve.go serves it):
// whether the kernel offers it, the queues' buffers on the ring threads
// (uring_pool.go), the registration of their entries, and turning it off
// for the connection when that fails.

// uringFault, from SBXFS_URING_FAULT, makes the io_uring start fail on
// purpose, for the tests of the fallback (TestIOUringFallsBack): "setup"
// fails the ring thread of the last CPU, "all" every one, "register" has
// the last queue's registration refused by the kernel.
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

// startURing registers the ring queues of srv's connection, which
// negotiated FUSE_OVER_IO_URING in INIT. It returns once every queue is
// registered (the kernel sends requests through the rings from then on) or
// has failed; on failure the kernel goes on with /dev/fuse, and the
// transport it may still return (not active) has queues to wait for.
func startURing(fs *filesystem, raw gofuse.RawFileSystem, srv *gofuse.Server, opts *gofuse.MountOptions) (*uringTransport, error) {
	devFd, err := fuseDevFd(srv)
	if err != nil {
		return nil, fmt.Errorf("%w: io_uring: %v", errURingStuck, err)
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
		if err := initProtocolServer(t.ps, srv.KernelSettings()); err != nil {
			failed = fmt.Errorf("io_uring: %w", err)
		}
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

// initProtocolServer hands the kernel's INIT to ps, which negotiates as the
// mount's server did (same options, same flags).
func initProtocolServer(ps *gofuse.ProtocolServer, k *gofuse.InitIn) error {
	in := *k // go-fuse's in structs start with the in header
	in.InHeader = gofuse.InHeader{Length: uint32(unsafe.Sizeof(in)), Opcode: 26, Unique: 1}
	req := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))
	out := make([]byte, 4096)
	n, st := ps.HandleRequest([][]byte{req}, [][]byte{out})
	if !st.Ok() || n < outHeaderSize || binary.LittleEndian.Uint32(out[4:]) != 0 {
		return fmt.Errorf("INIT: %v, error %d", st, int32(binary.LittleEndian.Uint32(out[4:])))
	}
	return nil
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
