package fuse

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hanwen/go-fuse/v2/splice"
)

// devLoop serves a mount's requests from /dev/fuse in place of go-fuse's
// loop (docs/design.md "Transport").
//
// go-fuse keeps a reader goroutine blocked in read(2) for every request in
// flight plus a spare, and never ends one: after any burst a mount has up
// to 17, which the kernel wakes in turn (the one that waited longest), so
// consecutive requests land on different threads, and the Go runtime's
// monitor keeps waking to take back the processors of threads blocked in
// read(2). On the 2-CPU VM this was measured on, that cost about as much
// as the work: a request took 1.5-3 context switches against
// fuse-overlayfs's one.
//
// devLoop serves with one reader, as fuse-overlayfs's single thread does:
// it reads a request, answers it in place and reads the next. A request
// that may wait (filesystem.mayWait: large READs, FSYNC, anything while a
// commit holds the gate) is answered on a goroutine while the reader goes
// on. Any other request that takes long (a directory read from a slow
// disk, a kernel lock) must not hold up the mount either: while requests
// come, a watchdog looks every devTick, and when every reader has been
// busy with the same request since its last look, it starts another
// reader (up to maxDevReaders). Each look wakes a thread: at 1 ms the
// looks cost untar and rm -rf 10% (A/B), at 4 ms about half that, at
// 10 ms cold git status lost some of its parallel lookups. Lookups do not
// wait for a look: a reader that takes a LOOKUP while the kernel holds
// more requests and no other reader waits starts a helper reader at once
// (up to maxHelpers), so parallel cold lookups wait for the disk side by
// side. A reader that finishes a request while another one waits in
// read(2) ends, so a mount goes back to one reader once nothing is slow.
type devLoop struct {
	fs     *filesystem
	raw    *rawFS
	ps     *gofuse.ProtocolServer
	fd     int      // our duplicate of the mount's /dev/fuse descriptor
	goFile *os.File // go-fuse's, closed when the mount is gone
	size   int      // a request buffer, and a reply buffer: the largest request or reply

	taken    atomic.Uint64 // requests read
	helpers  atomic.Uint64 // readers started for lookups that queued up
	trimmed  atomic.Uint64 // free buffers whose pages trim gave back
	finished atomic.Uint64 // requests answered by the readers themselves
	idle     atomic.Int32  // readers in read(2) or about to be
	sleeping atomic.Bool   // the watchdog waits for wake
	wake     chan struct{}
	spliced  sync.Map // uniques of READs answered by spliceRead

	mu      sync.Mutex
	readers int            // reader goroutines
	ended   bool           // the connection is gone: no reader is started
	free    []*devBuf      // buffers not in use
	stop    chan struct{}  // closed when the last reader ends
	wg      sync.WaitGroup // readers, requests answered on goroutines, the watchdog
}

// devBuf is a request buffer and a reply buffer, mapped outside the Go
// heap so that the pages a large request or reply touched can be given
// back. A reader's own buffer is given back at once; the kernel may write
// a request into it whenever its reader waits in read(2), so nothing else
// may touch it. Buffers of requests answered on goroutines are given back
// once the mount is quiet (trim).
type devBuf struct {
	mem, in, out []byte
	dirty        bool // pages beyond the first devSmall bytes are resident
}

const (
	maxDevReaders = 16                   // as go-fuse's loop
	devTick       = 4 * time.Millisecond // how often the watchdog looks while requests come
	devQuiet      = 50                   // ticks without a request before the watchdog sleeps
	devKeepBufs   = 4                    // free buffers kept mapped
	devSmall      = 64 << 10             // a request or reply beyond this dirties its buffer
	devHeadroom   = 128 << 10            // names, xattr values and headers beyond MaxWrite
	devReadSizeAt = inHeaderSize + 8 + 8 // fuse_read_in.size
)

// maxHelpers is how many readers requests that queue up may have at once:
// enough to overlap the disk reads of parallel lookups (git's threads
// lstat the index's files in parallel).
var maxHelpers = min(maxDevReaders, max(4, runtime.NumCPU()))

// startDevLoop serves srv's connection, whose INIT go-fuse has answered,
// with a devLoop. On error nothing was changed and go-fuse's loop can serve.
func startDevLoop(fs *filesystem, raw *rawFS, srv *gofuse.Server, opts *gofuse.MountOptions) (*devLoop, error) {
	fd, err := fuseDevFd(srv)
	if err != nil {
		return nil, err
	}
	page := os.Getpagesize()
	size := (opts.MaxWrite+devHeadroom+page-1)/page*page + page
	l := &devLoop{fs: fs, raw: raw, ps: gofuse.NewProtocolServer(raw, opts), fd: fd,
		size: size, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	b, err := l.getBuf()
	if err == nil {
		err = initProtocolServer(l.ps, srv.KernelSettings())
	}
	if err == nil {
		l.goFile, err = goFuseLoopOver(srv)
	}
	if err != nil {
		if b != nil {
			unix.Munmap(b.mem)
		}
		unix.Close(fd)
		return nil, err
	}
	l.readers = 1
	l.sleeping.Store(true) // the first request wakes the watchdog
	raw.dev = l
	l.wg.Add(2)
	go l.read(b)
	go l.watch()
	return l, nil
}

// read is a reader: it reads requests into b and answers them until the
// connection is gone or another reader waits.
func (l *devLoop) read(b *devBuf) {
	defer l.wg.Done()
	for {
		l.idle.Add(1)
		n, err := unix.Read(l.fd, b.in)
		l.idle.Add(-1)
		if err != nil {
			if err == unix.EINTR || err == unix.ENOENT || err == unix.EAGAIN {
				continue // a signal, or the request was withdrawn
			}
			// ENODEV: unmounted. ECONNABORTED: the same, when the
			// kernel tears the connection down while this read takes a
			// request (fuse_dev_do_read; once in CI, at TestLocks's
			// unmount).
			if err != unix.ENODEV && err != unix.ECONNABORTED {
				l.fs.log.Error("read /dev/fuse", "err", err)
			}
			l.end(b)
			return
		}
		l.taken.Add(1)
		if l.sleeping.Load() && l.sleeping.CompareAndSwap(true, false) {
			l.wakeWatchdog()
		}
		// Lookups that queue up while this one is answered (several
		// threads walking a tree: git's lstat of the index) each may wait
		// for the disk: give them a reader now rather than at the
		// watchdog's next look. Only at a LOOKUP: a single writer's
		// queue holds its RELEASEs and FORGETs too, and a helper for
		// those cost untar 25% (A/B).
		if binary.LittleEndian.Uint32(b.in[4:]) == opLookup && l.idle.Load() == 0 && l.queued() {
			l.addHelper()
		}
		if (n > devSmall || l.mayWait(b.in[:n])) && l.answerOff(b.in[:n]) {
			if n > devSmall {
				giveBack(b.in[devSmall:])
			}
			continue
		}
		l.answer(b, n)
		if b.dirty {
			giveBack(b.out[devSmall:])
			b.dirty = false
		}
		l.finished.Add(1)
		if l.idle.Load() > 0 && l.leave() {
			l.putBuf(b)
			return
		}
	}
}

// answerOff answers the request req on a goroutine, with a copy in a
// buffer of its own. It reports false when there is no buffer to be had.
func (l *devLoop) answerOff(req []byte) bool {
	b, err := l.getBuf()
	if err != nil {
		return false
	}
	n := copy(b.in, req)
	b.dirty = n > devSmall
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.answer(b, n)
		l.putBuf(b)
	}()
	return true
}

// giveBack hands the pages of p, which nothing is using, back to the
// kernel.
func giveBack(p []byte) {
	_ = unix.Madvise(p, unix.MADV_DONTNEED)
}

// mayWait tells the requests answered on a goroutine (filesystem.mayWait).
func (l *devLoop) mayWait(req []byte) bool {
	if len(req) < devReadSizeAt+4 {
		return l.fs.mayWait(binary.LittleEndian.Uint32(req[4:]), 0)
	}
	return l.fs.mayWait(binary.LittleEndian.Uint32(req[4:]), binary.LittleEndian.Uint32(req[devReadSizeAt:]))
}

// answer has the ProtocolServer run the request of n bytes in b and writes
// its reply.
func (l *devLoop) answer(b *devBuf, n int) {
	m, st := l.ps.HandleRequest([][]byte{b.in[:n]}, [][]byte{b.out})
	if m > devSmall {
		b.dirty = true
	}
	if !st.Ok() {
		// A request go-fuse could not take apart: fail it rather than
		// leave the caller waiting.
		errno := syscall.EIO
		m = outHeaderSize
		binary.LittleEndian.PutUint32(b.out[0:], outHeaderSize)
		binary.LittleEndian.PutUint32(b.out[4:], uint32(-int32(errno)))
		copy(b.out[8:16], b.in[8:16])
	}
	if m == 0 {
		return // FORGET and the like have no reply
	}
	if binary.LittleEndian.Uint32(b.in[4:]) == opRead {
		if _, done := l.spliced.LoadAndDelete(binary.LittleEndian.Uint64(b.in[8:])); done {
			return
		}
	}
	// ENOENT: the request was interrupted and is gone; ENODEV,
	// ECONNABORTED: unmounted.
	if _, err := unix.Write(l.fd, b.out[:m]); err != nil && err != unix.ENOENT && err != unix.ENODEV && err != unix.ECONNABORTED {
		l.fs.log.Error("reply on /dev/fuse", "op", binary.LittleEndian.Uint32(b.in[4:]), "err", err)
	}
}

// spliceRead answers READ unique with size bytes of the file fd at off by
// splice(2), as go-fuse's own loop does: the reply's header into a pipe,
// the file's data after it, the pipe into /dev/fuse, so the data is not
// copied through this process (go-fuse's ProtocolServer would read it into
// the reply buffer: cold reads of original files measured ~15% slower).
// It reports false, having replied nothing, when it cannot (no pipe, or
// the file shorter than its size said); the caller then replies by copy.
func (l *devLoop) spliceRead(unique uint64, fd int, off int64, size int) bool {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return false
	}
	n := int(max(0, min(int64(size), st.Size-off)))
	total := outHeaderSize + n
	pair, err := splice.Get()
	if err != nil {
		return false
	}
	defer splice.Done(pair) // empties the pipe
	if pair.Grow(total+os.Getpagesize()) != nil {
		return false
	}
	var h [outHeaderSize]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(total))
	binary.LittleEndian.PutUint64(h[8:], unique)
	if w, err := pair.Write(h[:]); err != nil || w != len(h) {
		return false
	}
	for got := 0; got < n; {
		m, err := pair.LoadFromAt(uintptr(fd), n-got, off+int64(got))
		if err != nil || m <= 0 {
			return false
		}
		got += m
	}
	l.spliced.Store(unique, struct{}{})
	if _, err := pair.WriteTo(uintptr(l.fd), total); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) {
		l.spliced.Delete(unique)
		return false
	}
	return true
}

// leave ends the calling reader if it is not the only one: another one
// waits in read(2).
func (l *devLoop) leave() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.readers > 1 && l.idle.Load() > 0 {
		l.readers--
		return true
	}
	return false
}

// end is a reader's end at unmount.
func (l *devLoop) end(b *devBuf) {
	l.putBuf(b)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.readers--
	if l.readers == 0 && !l.ended {
		l.ended = true
		close(l.stop)
	}
}

// queued reports whether the kernel holds more requests for the mount,
// not yet read by any reader.
func (l *devLoop) queued() bool {
	fds := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0
}

// addHelper starts another reader for requests that queue up behind the
// one being answered, up to maxHelpers readers in all.
func (l *devLoop) addHelper() {
	if l.addReaderUpTo(maxHelpers) {
		l.helpers.Add(1)
	}
}

// addReader starts another reader unless there are maxDevReaders or the
// connection is gone.
func (l *devLoop) addReader() {
	l.addReaderUpTo(maxDevReaders)
}

// addReaderUpTo starts another reader unless there are most or the
// connection is gone, and reports whether it did.
func (l *devLoop) addReaderUpTo(most int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || l.readers >= most {
		return false
	}
	b, err := l.getBufLocked()
	if err != nil {
		return false
	}
	l.readers++
	l.wg.Add(1)
	go l.read(b)
	return true
}

func (l *devLoop) wakeWatchdog() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// watch is the watchdog. It sleeps while no request comes; while they
// come it looks every devTick and starts a reader when every reader has
// been busy since its last look with a request that has not ended.
func (l *devLoop) watch() {
	defer l.wg.Done()
	tick := time.NewTicker(devTick)
	defer tick.Stop()
	for {
		tick.Stop()
		select {
		case <-l.wake:
		case <-l.stop:
			return
		}
		tick.Reset(devTick)
		taken, finished := l.taken.Load(), l.finished.Load()
		for quiet := 0; quiet < devQuiet || l.idle.Load() == 0; {
			select {
			case <-tick.C:
			case <-l.stop:
				return
			}
			nt, nf := l.taken.Load(), l.finished.Load()
			if nt == taken && nf == finished && l.idle.Load() == 0 {
				l.addReader()
			}
			if nt == taken {
				quiet++
			} else {
				quiet = 0
			}
			taken, finished = nt, nf
		}
		l.trim()
		l.sleeping.Store(true)
		if l.taken.Load() != taken && l.sleeping.CompareAndSwap(true, false) {
			l.wakeWatchdog() // a request came meanwhile and saw no sleeper
		}
	}
}

// getBuf returns a free buffer or maps a new one.
func (l *devLoop) getBuf() (*devBuf, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.getBufLocked()
}

func (l *devLoop) getBufLocked() (*devBuf, error) {
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		return b, nil
	}
	mem, err := unix.Mmap(-1, 0, 2*l.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	return &devBuf{mem: mem, in: mem[:l.size], out: mem[l.size:]}, nil
}

func (l *devLoop) putBuf(b *devBuf) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.free) >= devKeepBufs {
		unix.Munmap(b.mem)
		return
	}
	l.free = append(l.free, b)
}

// trim gives back the pages large requests left in free buffers.
func (l *devLoop) trim() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.free {
		if b.dirty {
			giveBack(b.mem)
			b.dirty = false
			l.trimmed.Add(1)
		}
	}
}

// wait waits for the readers to see the mount gone and for every request
// on a goroutine to be answered, then lets go of the descriptors and the
// buffers.
func (l *devLoop) wait() {
	l.wg.Wait()
	unix.Close(l.fd)
	l.goFile.Close()
	l.mu.Lock()
	for _, b := range l.free {
		unix.Munmap(b.mem)
	}
	l.free = nil
	l.mu.Unlock()
	l.raw.OnUnmount()
}
