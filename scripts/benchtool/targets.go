package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A target is one way of presenting an original tree to a workload.
type target struct {
	name string
	kind targetKind
	// uring (sbxfs): the server takes the kernel's requests through
	// io_uring: mounted without --no-io-uring while the fuse module's
	// enable_uring is Y (uring.go). Without it sbxfs is mounted with
	// --no-io-uring: requests through /dev/fuse, as on every stock kernel.
	uring bool
}

type targetKind int

const (
	kindExt4 targetKind = iota
	kindOverlay
	kindFuseOverlay
	kindLoopback
	kindSbxfs
)

// allTargets in report order; overlayfs is the reference of every ratio.
// A run measures env.targets: these, less sbxfs-uring where the kernel
// cannot serve FUSE over io_uring (uring.go).
var allTargets = []*target{
	{name: "ext4", kind: kindExt4},
	{name: "overlayfs", kind: kindOverlay},
	{name: "fuse-overlayfs", kind: kindFuseOverlay},
	{name: loopbackTarget, kind: kindLoopback},
	{name: sbxfsTarget, kind: kindSbxfs},
	{name: uringTarget, kind: kindSbxfs, uring: true},
}

const (
	// loopbackTarget is go-fuse's own loopback file system (loopback.go)
	// serving the ext4 target's tree: what FUSE costs with a server
	// that only forwards each request, for reference.
	loopbackTarget = "fuse-loopback"
	refTarget      = "overlayfs"
	sbxfsTarget    = "sbxfs"       // requests through /dev/fuse (--no-io-uring)
	uringTarget    = "sbxfs-uring" // requests through io_uring
)

// withoutTarget returns ts less the target called name.
func withoutTarget(ts []*target, name string) []*target {
	var out []*target
	for _, t := range ts {
		if t.name != name {
			out = append(out, t)
		}
	}
	return out
}

// onTree reports whether t has no upper layer: it works on the tree
// itself (the original, or a copy of it: instMode), as ext4 and the
// loopback over it do.
func (t *target) onTree() bool { return t.kind == kindExt4 || t.kind == kindLoopback }

// instMode says what a workload does to the tree, which decides what the
// targets without an upper layer (onTree) work on.
type instMode int

const (
	readOnly instMode = iota // ext4: the original itself
	writeNew                 // ext4: the original; the workload only adds names and removes them
	modify                   // ext4: a copy of the original (cp -a), made before timing
)

// An instance is one target's view of an original: a fresh upper for the
// overlays, the original or a copy of it for ext4.
type instance struct {
	e     *env
	t     *target
	orig  string
	dir   string // the instance's own directory (removed by close)
	tree  string // onTree targets: the tree they work on (the original or a copy)
	path  string // where the workload runs
	upper string // overlay upper (sbxfs: the sandbox directory)
	wdir  string // overlay work directory
	mnt   string
	undo  func() error // unmounts the current mount, once
}

// open makes a fresh instance of orig for t and mounts it.
func (e *env) open(t *target, orig string, mode instMode) (*instance, error) {
	dir, err := e.newInstDir(t.name)
	if err != nil {
		return nil, err
	}
	in := &instance{e: e, t: t, orig: orig, dir: dir}
	switch t.kind {
	case kindExt4, kindLoopback:
		in.tree = orig
		if mode == modify {
			in.tree = filepath.Join(dir, "tree")
			if err := e.cmdIn("", nil, "cp", "-a", orig, in.tree); err != nil {
				return nil, err
			}
		}
		if t.kind == kindExt4 {
			in.path = in.tree
			return in, nil
		}
	case kindOverlay, kindFuseOverlay:
		in.upper, in.wdir = filepath.Join(dir, "upper"), filepath.Join(dir, "work")
		for _, d := range []string{in.upper, in.wdir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return nil, err
			}
		}
	case kindSbxfs:
		in.upper = filepath.Join(dir, "sandbox")
	}
	in.mnt = filepath.Join(dir, "mnt")
	in.path = in.mnt
	if err := os.Mkdir(in.mnt, 0o755); err != nil {
		return nil, err
	}
	if err := in.mount(); err != nil {
		if !isMountpoint(in.mnt) {
			os.RemoveAll(dir)
		}
		return nil, err
	}
	return in, nil
}

// mount mounts the instance (again, over the same upper).
func (in *instance) mount() error {
	e := in.e
	switch in.t.kind {
	case kindOverlay:
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", in.orig, in.upper, in.wdir)
		if err := unix.Mount("overlay", in.mnt, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mount -t overlay %s: %w", opts, err)
		}
		mnt := in.mnt
		in.undo = e.track("overlayfs "+mnt, func(ctx context.Context) error { return unmountRetry(mnt) })
	case kindFuseOverlay:
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", in.orig, in.upper, in.wdir)
		mnt := in.mnt
		// Tracked before it starts: an interrupted start may still mount.
		in.undo = e.track("fuse-overlayfs "+mnt, func(ctx context.Context) error {
			pid := findProcess("fuse-overlayfs", mnt)
			if !isMountpoint(mnt) {
				return nil
			}
			err := unmountRetry(mnt)
			if pid > 0 && !waitExit(pid, 10*time.Second) {
				return fmt.Errorf("fuse-overlayfs (pid %d) still running after unmount", pid)
			}
			return err
		})
		if err := e.cmdIn("", nil, "fuse-overlayfs", "-o", opts, mnt); err != nil {
			in.undo()
			return err
		}
		if !waitMounted(mnt, 10*time.Second) {
			in.undo()
			return fmt.Errorf("fuse-overlayfs did not mount %s", mnt)
		}
	case kindLoopback:
		mnt := in.mnt
		srv, err := startLoopback(in.tree, mnt)
		if err != nil {
			return err
		}
		in.undo = e.track("fuse-loopback "+mnt, func(ctx context.Context) error { return srv.stop() })
	case kindSbxfs:
		mnt := in.mnt
		args := []string{"--state-dir", e.state, "mount", "--upper", in.upper}
		want := "/dev/fuse"
		if in.t.uring {
			want = "io_uring"
			if err := e.uringParamIs("Y"); err != nil {
				return fmt.Errorf("%s: %w", in.t.name, err)
			}
		} else {
			args = append(args, "--no-io-uring")
		}
		args = append(args, in.orig, mnt)
		// The server appends to its log at every mount of the same upper:
		// only what this mount's server writes is read.
		log := filepath.Join(in.upper, "work", "server.log")
		var logStart int64
		if st, err := os.Stat(log); err == nil {
			logStart = st.Size()
		}
		in.undo = e.track("sbxfs "+mnt, func(ctx context.Context) error { return e.sbxfsUnmount(ctx, mnt) })
		if err := e.cmdIn("", nil, e.opt.sbxfs, args...); err != nil {
			in.undo()
			return err
		}
		if got, err := serverTransport(log, logStart); err != nil || got != want {
			in.undo()
			if err == nil {
				err = fmt.Errorf("the server of %s says transport=%s, expected %s (%s)", mnt, got, want, uringParamNow())
			}
			return fmt.Errorf("%s is not what it claims to measure: %w", in.t.name, err)
		}
	}
	return nil
}

// sbxfsUnmount unmounts an sbxfs mount with its own command (which waits
// for the server), falling back to a lazy unmount.
func (e *env) sbxfsUnmount(ctx context.Context, mnt string) error {
	if !isMountpoint(mnt) {
		return nil
	}
	out, err := exec.CommandContext(ctx, e.opt.sbxfs, "unmount", mnt).CombinedOutput()
	if err == nil {
		return nil
	}
	if isMountpoint(mnt) {
		if err2 := unix.Unmount(mnt, unix.MNT_DETACH); err2 != nil {
			return fmt.Errorf("sbxfs unmount %s: %v: %s; umount -l: %v", mnt, err, strings.TrimSpace(string(out)), err2)
		}
		return fmt.Errorf("sbxfs unmount %s: %v: %s (detached lazily)", mnt, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// remount unmounts and mounts again over the same upper (the same tree),
// so the FUSE server (and the kernel's caches of the mount) start cold.
// ext4: no-op.
func (in *instance) remount() error {
	if in.t.kind == kindExt4 {
		return nil
	}
	if err := in.undo(); err != nil {
		return err
	}
	return in.mount()
}

// serverPID is the process serving a FUSE instance, or 0.
func (in *instance) serverPID() int {
	switch in.t.kind {
	case kindSbxfs:
		b, err := os.ReadFile(filepath.Join(in.upper, "work", "server.pid"))
		if err != nil {
			return 0
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return pid
	case kindFuseOverlay:
		return findProcess("fuse-overlayfs", in.mnt)
	}
	return 0
}

// close unmounts the instance and removes its directory.
func (in *instance) close() error {
	var err error
	if in.undo != nil {
		err = in.undo()
	}
	if isMountpoint(in.mnt) {
		return errors.Join(err, fmt.Errorf("%s is still mounted; not removing %s", in.mnt, in.dir))
	}
	return errors.Join(err, os.RemoveAll(in.dir))
}

// unmountRetry unmounts, retrying a busy mount for a while, then detaches
// it lazily.
func unmountRetry(mnt string) error {
	var err error
	for i := 0; i < 50; i++ {
		if err = unix.Unmount(mnt, 0); err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err2 := unix.Unmount(mnt, unix.MNT_DETACH); err2 != nil {
		return fmt.Errorf("umount %s: %v; umount -l: %v", mnt, err, err2)
	}
	return fmt.Errorf("umount %s: %v (detached lazily)", mnt, err)
}

func waitMounted(mnt string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if isMountpoint(mnt) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// findProcess returns the pid of a live process named comm whose
// arguments include arg, or 0.
func findProcess(comm, arg string) int {
	ents, _ := os.ReadDir("/proc")
	for _, de := range ents {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != comm {
			continue
		}
		for _, a := range args[1:] {
			if a == arg && processAlive(pid) {
				return pid
			}
		}
	}
	return 0
}
