package manager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// lockLevel orders the manager's locks: a goroutine takes them in
// increasing level only, and never two of the same level (see the lock
// order at the top of manager.go).
type lockLevel int

const (
	levelLife     lockLevel = iota + 1 // Manager.life: shared by every call, exclusive for Close
	levelPlan                          // one plan: a semaphore, then a flock on plans/<plan>.lock
	levelRegistry                      // Manager.mu: the in-memory registry; nothing is taken under it
)

func (l lockLevel) String() string {
	return [...]string{"?", "life", "plan", "registry"}[l]
}

// checkLockOrder turns the lock-order checker on (tests do): taking a lock
// out of order panics with both levels, whether or not it would deadlock
// this time.
var checkLockOrder atomic.Bool

var held = struct {
	sync.Mutex
	m map[uint64][]lockLevel // goroutine id -> levels held, in order taken
}{m: map[uint64][]lockLevel{}}

// orderEnter is called before a lock of level l is taken.
func orderEnter(l lockLevel) {
	if !checkLockOrder.Load() {
		return
	}
	g := goid()
	held.Lock()
	defer held.Unlock()
	hs := held.m[g]
	if n := len(hs); n > 0 && hs[n-1] >= l {
		panic(fmt.Sprintf("sbxfs manager: lock order violated: taking the %s lock while holding the %s lock (held: %v)", l, hs[n-1], hs))
	}
	held.m[g] = append(hs, l)
}

// orderLeave is called after a lock of level l is released (or was not
// taken after orderEnter).
func orderLeave(l lockLevel) {
	if !checkLockOrder.Load() {
		return
	}
	g := goid()
	held.Lock()
	defer held.Unlock()
	hs := held.m[g]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i] == l {
			hs = append(hs[:i], hs[i+1:]...)
			break
		}
	}
	if len(hs) == 0 {
		delete(held.m, g)
	} else {
		held.m[g] = hs
	}
}

// goid is the current goroutine's id, from its stack header
// ("goroutine 42 [running]:"). Only the checker uses it.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	n, _ := strconv.ParseUint(string(b), 10, 64)
	return n
}

// planLocks holds one semaphore per plan name. mu guards the map only and
// is held for a map access, nothing else: it is outside the lock order.
type planLocks struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

func (p *planLocks) get(plan string) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]chan struct{}{}
	}
	sem, ok := p.m[plan]
	if !ok {
		sem = make(chan struct{}, 1)
		p.m[plan] = sem
	}
	return sem
}

// lockPlan takes the lock of plan: the in-process semaphore, then the
// flock on StateRoot/plans/<plan>.lock for other processes. It waits until
// ctx is done. The returned function releases both.
func (m *Manager) lockPlan(ctx context.Context, plan string) (func(), error) {
	if err := checkPlan(plan); err != nil {
		return nil, err
	}
	sem := m.plans.get(plan)
	orderEnter(levelPlan)
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		orderLeave(levelPlan)
		return nil, fmt.Errorf("wait for plan %s: %w", plan, ctx.Err())
	}
	fd, err := flockWait(ctx, filepath.Join(m.root, "plans", plan+".lock"))
	if err != nil {
		<-sem
		orderLeave(levelPlan)
		return nil, fmt.Errorf("lock plan %s: %w", plan, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			unix.Close(fd)
			<-sem
			orderLeave(levelPlan)
		})
	}, nil
}

// lockRegistry takes the registry lock. Hold it only to read or change
// m.recs and m.mounts: no I/O, no other lock.
func (m *Manager) lockRegistry() func() {
	orderEnter(levelRegistry)
	m.mu.Lock()
	return func() {
		m.mu.Unlock()
		orderLeave(levelRegistry)
	}
}

// enter starts a public call: it shares the life lock with every other
// call, so Close waits for them, and refuses a closed manager.
func (m *Manager) enter() (func(), error) {
	orderEnter(levelLife)
	m.life.RLock()
	leave := func() {
		m.life.RUnlock()
		orderLeave(levelLife)
	}
	if m.closed {
		leave()
		return nil, ErrClosed
	}
	return leave, nil
}

// openLockFile opens (creating) a lock file that is never removed:
// removing a lock file lets two processes lock two different inodes.
func openLockFile(path string) (int, error) {
	return unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
}

// flockWait takes an exclusive flock on path, polling until ctx is done.
func flockWait(ctx context.Context, path string) (int, error) {
	fd, err := openLockFile(path)
	if err != nil {
		return -1, err
	}
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EINTR):
			continue
		case !errors.Is(err, unix.EWOULDBLOCK):
			unix.Close(fd)
			return -1, err
		}
		select {
		case <-ctx.Done():
			unix.Close(fd)
			return -1, fmt.Errorf("held by another process: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lockStateRoot takes StateRoot/manager.lock without waiting and writes
// this process's pid into it; ErrLocked names the holder.
func lockStateRoot(root string) (*os.File, error) {
	path := filepath.Join(root, "manager.lock")
	fd, err := openLockFile(path)
	if err != nil {
		return nil, fmt.Errorf("state root lock: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (process %s)", ErrLocked, root, strings.TrimSpace(string(b[:n])))
		}
		return nil, fmt.Errorf("state root lock: %w", err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
