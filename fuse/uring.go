package fuse

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file is the small part of io_uring that FUSE over io_uring needs:
// one ring with 128-byte submission entries, owned by one thread, that
// submits commands and waits for their completions. See uring_pool.go
// (the threads) and uring_serve.go (the mounts' queues).

const (
	ioringSetupCQSize       = 1 << 3
	ioringSetupSQE128       = 1 << 10
	ioringSetupSingleIssuer = 1 << 12
	ioringSetupDeferTaskrun = 1 << 13

	ioringFeatSingleMmap = 1 << 0

	ioringEnterGetevents = 1 << 0

	ioringOffSQRing = 0
	ioringOffSQEs   = 0x10000000

	ioringOpRead     = 22
	ioringOpUringCmd = 46

	sqeSize = 128 // with IORING_SETUP_SQE128
	cqeSize = 16
)

// ringParams is struct io_uring_params.
type ringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

// ring is one io_uring instance. It is not safe for concurrent use: with
// IORING_SETUP_SINGLE_ISSUER only the thread that made it may submit.
type ring struct {
	fd      int
	ringMem []byte
	sqeMem  []byte

	sqHead, sqTail *uint32
	sqMask         uint32
	sqEntries      uint32
	sqArray        []uint32
	sqTail0        uint32 // our tail, published on enter
	unsubmitted    uint32

	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []byte
}

// newRing sets up a ring of at least entries submission slots and cq
// completion slots (0: the kernel's default, twice entries), owned by the
// calling thread (which must stay locked to its goroutine). Completions
// beyond cq wait in the kernel (IORING_FEAT_NODROP, Linux 5.5+).
func newRing(entries, cq uint32) (*ring, error) {
	flags := uint32(ioringSetupSQE128 | ioringSetupSingleIssuer | ioringSetupDeferTaskrun)
	if cq > 0 {
		flags |= ioringSetupCQSize
	}
	p := ringParams{flags: flags, cqEntries: cq}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno == unix.EINVAL {
		// Kernels before 6.1 have no DEFER_TASKRUN.
		p = ringParams{flags: flags &^ (ioringSetupSingleIssuer | ioringSetupDeferTaskrun), cqEntries: cq}
		fd, _, errno = unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	}
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ring{fd: int(fd)}
	if p.features&ioringFeatSingleMmap == 0 {
		r.close()
		return nil, errors.New("io_uring: kernel has no single mmap for the rings")
	}
	size := max(int(p.sqOff.array+p.sqEntries*4), int(p.cqOff.cqes+p.cqEntries*cqeSize))
	mem, err := unix.Mmap(r.fd, ioringOffSQRing, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring: map rings: %w", err)
	}
	r.ringMem = mem
	sqes, err := unix.Mmap(r.fd, ioringOffSQEs, int(p.sqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring: map submission entries: %w", err)
	}
	r.sqeMem = sqes
	u32 := func(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead, r.sqTail = u32(p.sqOff.head), u32(p.sqOff.tail)
	r.sqMask, r.sqEntries = *u32(p.sqOff.ringMask), p.sqEntries
	r.sqArray = unsafe.Slice(u32(p.sqOff.array), p.sqEntries)
	r.sqTail0 = atomic.LoadUint32(r.sqTail)
	r.cqHead, r.cqTail = u32(p.cqOff.head), u32(p.cqOff.tail)
	r.cqMask = *u32(p.cqOff.ringMask)
	r.cqes = mem[p.cqOff.cqes : p.cqOff.cqes+p.cqEntries*cqeSize]
	return r, nil
}

func (r *ring) close() {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.ringMem != nil {
		unix.Munmap(r.ringMem)
	}
	unix.Close(r.fd)
}

// sqe returns a zeroed submission entry to fill in, or nil when the
// submission queue is full (enter first).
func (r *ring) sqe() []byte {
	if r.sqTail0-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		return nil
	}
	i := r.sqTail0 & r.sqMask
	r.sqArray[i] = i
	s := r.sqeMem[i*sqeSize : (i+1)*sqeSize]
	clear(s)
	r.sqTail0++
	r.unsubmitted++
	return s
}

// enter submits the entries filled in since the last call and waits until
// at least wait completions are ready.
func (r *ring) enter(wait uint32) error {
	atomic.StoreUint32(r.sqTail, r.sqTail0)
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.unsubmitted), uintptr(wait), ioringEnterGetevents, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
		r.unsubmitted -= uint32(n)
		return nil
	}
}

// completions calls fn for every completion ready and consumes them.
func (r *ring) completions(fn func(userData uint64, res int32)) {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		c := r.cqes[(head&r.cqMask)*cqeSize:]
		ud := *(*uint64)(unsafe.Pointer(&c[0]))
		res := *(*int32)(unsafe.Pointer(&c[8]))
		fn(ud, res)
	}
	atomic.StoreUint32(r.cqHead, head)
}

// putUringCmd fills s as an IORING_OP_URING_CMD on fd. The command's
// 80-byte area starts at byte 48 of the entry.
func putUringCmd(s []byte, fd int, cmdOp uint32, iov *unix.Iovec, nIov uint32, userData uint64) {
	s[0] = ioringOpUringCmd
	*(*int32)(unsafe.Pointer(&s[4])) = int32(fd)
	*(*uint32)(unsafe.Pointer(&s[8])) = cmdOp
	*(*uint64)(unsafe.Pointer(&s[16])) = uint64(uintptr(unsafe.Pointer(iov)))
	*(*uint32)(unsafe.Pointer(&s[24])) = nIov
	*(*uint64)(unsafe.Pointer(&s[32])) = userData
}

// putRead fills s as an IORING_OP_READ of buf from fd.
func putRead(s []byte, fd int, buf []byte, userData uint64) {
	s[0] = ioringOpRead
	*(*int32)(unsafe.Pointer(&s[4])) = int32(fd)
	*(*uint64)(unsafe.Pointer(&s[8])) = ^uint64(0) // current position
	*(*uint64)(unsafe.Pointer(&s[16])) = uint64(uintptr(unsafe.Pointer(&buf[0])))
	*(*uint32)(unsafe.Pointer(&s[24])) = uint32(len(buf))
	*(*uint64)(unsafe.Pointer(&s[32])) = userData
}
