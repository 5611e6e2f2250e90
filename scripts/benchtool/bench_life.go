package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sbx runs the sbxfs binary with a state directory.
func (e *env) sbx(state string, args ...string) (string, error) {
	return e.output("", nil, e.opt.sbxfs, append([]string{"--state-dir", state}, args...)...)
}

func (e *env) timeSbx(state string, args ...string) (float64, error) {
	return e.timeCmd("", nil, e.opt.sbxfs, append([]string{"--state-dir", state}, args...)...)
}

// startDaemon starts an sbxfs daemon on a private state root, with the
// daemon command's flags, and returns it and the function that stops it
// (also run by the cleanup).
func (e *env) startDaemon(name string, flags ...string) (state string, pid int, stop func() error, err error) {
	state = filepath.Join(e.work, "daemon-"+name)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return "", 0, nil, err
	}
	// The pid is taken as soon as the daemon answers, so it can be stopped
	// even when its state root is damaged later.
	stop = e.track("daemon "+state, func(ctx context.Context) error {
		if pid == 0 {
			pid = daemonPID(state) // interrupted while starting
		}
		return stopDaemon(pid, state)
	})
	if _, err := e.sbx(state, append([]string{"daemon"}, flags...)...); err != nil {
		stop()
		return "", 0, nil, err
	}
	if pid = daemonPID(state); pid == 0 {
		stop()
		return "", 0, nil, fmt.Errorf("no daemon pid in %s/manager.lock", state)
	}
	return state, pid, stop, nil
}

// daemonPID is the pid of the live daemon of a state root, or 0.
func daemonPID(state string) int {
	b, err := os.ReadFile(filepath.Join(state, "manager.lock"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || !isDaemonOf(pid, state) {
		return 0
	}
	return pid
}

// isDaemonOf: pid is alive and serves state (not a reused pid).
func isDaemonOf(pid int, state string) bool {
	if !processAlive(pid) {
		return false
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Contains(string(cmd), state)
}

// stopDaemon stops the daemon pid of state with SIGTERM (it unmounts its
// sandboxes), then SIGKILL after a minute; the sweep unmounts what a
// killed daemon left.
func stopDaemon(pid int, state string) error {
	if pid <= 0 || !isDaemonOf(pid, state) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	if waitExit(pid, time.Minute) {
		return nil
	}
	syscall.Kill(pid, syscall.SIGKILL)
	return fmt.Errorf("daemon %d of %s did not stop in a minute; killed", pid, state)
}

// benchCreate: time until a sandbox is usable, standalone and through the
// daemon, for originals of every size.
func (e *env) benchCreate() error {
	state, _, stop, err := e.startDaemon("create")
	if err != nil {
		return err
	}
	defer stop()
	for rep := 0; rep < e.opt.reps; rep++ {
		for _, n := range e.sz.lifeN {
			orig, err := e.need(fmt.Sprintf("life-%d", n))
			if err != nil {
				return err
			}
			e.logf("-- create rep %d/%d: n=%d", rep+1, e.opt.reps, n)
			for s := 0; s < e.sz.createSamples; s++ {
				if err := e.createStandalone(orig, n); err != nil {
					return err
				}
				d, err := e.timeSbx(state, "create", "--plan", "create", orig)
				if err != nil {
					return err
				}
				e.res.add("create", "create", nCol(n), d)
				if _, err := e.sbx(state, "destroy", "--plan", "create"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (e *env) createStandalone(orig string, n int) error {
	dir, err := e.newInstDir("create")
	if err != nil {
		return err
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	undo := e.track("sbxfs "+mnt, func(ctx context.Context) error { return e.sbxfsUnmount(ctx, mnt) })
	d, err := e.timeSbx(e.state, "mount", "--upper", filepath.Join(dir, "sandbox"), orig, mnt)
	if uerr := undo(); err == nil {
		err = uerr
	}
	if err != nil {
		return err
	}
	e.res.add("create", "mount", nCol(n), d)
	return os.RemoveAll(dir)
}

// benchDiffCommit: diff and commit of k files changed through a mount,
// over originals of every size, the upper on the scratch disk or on a
// tmpfs.
func (e *env) benchDiffCommit() error {
	tmpfs := filepath.Join(e.work, "tmpfs")
	if err := os.MkdirAll(tmpfs, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", tmpfs, "tmpfs", 0, "size=2g,mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	defer e.track("tmpfs "+tmpfs, func(ctx context.Context) error { return unmountRetry(tmpfs) })()
	for rep := 0; rep < e.opt.reps; rep++ {
		for _, n := range e.sz.lifeN {
			orig, err := e.need(fmt.Sprintf("life-%d", n))
			if err != nil {
				return err
			}
			e.logf("-- diffcommit rep %d/%d: n=%d", rep+1, e.opt.reps, n)
			for _, fsys := range []string{"same", "other"} {
				for _, k := range e.sz.lifeK {
					if k > n {
						continue
					}
					if err := e.diffCommitOne(orig, n, k, fsys, tmpfs, rep); err != nil {
						return fmt.Errorf("n=%d k=%d upper %s: %w", n, k, fsys, err)
					}
				}
			}
		}
	}
	return nil
}

func (e *env) diffCommitOne(orig string, n, k int, fsys, tmpfs string, rep int) error {
	dir, err := e.newInstDir("commit")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sbdir := filepath.Join(dir, "sandbox")
	if fsys == "other" {
		sbdir = filepath.Join(tmpfs, filepath.Base(dir))
		defer os.RemoveAll(sbdir)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	undo := e.track("sbxfs "+mnt, func(ctx context.Context) error { return e.sbxfsUnmount(ctx, mnt) })
	defer undo()
	if _, err := e.sbx(e.state, "mount", "--upper", sbdir, orig, mnt); err != nil {
		return err
	}
	for j := 0; j < k; j++ {
		p := filepath.Join(mnt, lifePath(j))
		if err := os.WriteFile(p, []byte(fmt.Sprintf("round %d k %d\n", rep, k)), 0o644); err != nil {
			return err
		}
	}
	unix.Sync() // the writes' writeback is not the commit's
	d, err := e.timeSbx(e.state, "diff", mnt)
	if err != nil {
		return err
	}
	e.res.add("diffcommit", fmt.Sprintf("diff.%s.k%d", fsys, k), nCol(n), d)
	if d, err = e.timeSbx(e.state, "commit", mnt); err != nil {
		return err
	}
	e.res.add("diffcommit", fmt.Sprintf("commit.%s.k%d", fsys, k), nCol(n), d)
	return nil
}

// benchPlan: a plan of planSandboxes sandboxes with planFiles changed
// files each, committed at once.
func (e *env) benchPlan() error {
	state, _, stop, err := e.startDaemon("plan")
	if err != nil {
		return err
	}
	defer stop()
	for rep := 0; rep < e.opt.reps; rep++ {
		plan := fmt.Sprintf("p%d", rep)
		for i := 0; i < e.sz.planSandboxes; i++ {
			orig, err := e.need(fmt.Sprintf("plan-%02d", i))
			if err != nil {
				return err
			}
			out, err := e.sbx(state, "create", "--plan", plan, orig)
			if err != nil {
				return err
			}
			_, mnt, ok := strings.Cut(strings.TrimSpace(out), "\t")
			if !ok {
				return fmt.Errorf("sbxfs create printed %q", out)
			}
			for f := 0; f < e.sz.planFiles; f++ {
				p := filepath.Join(mnt, "d000", fmt.Sprintf("f%04d.txt", f))
				if err := os.WriteFile(p, []byte(fmt.Sprintf("plan %s\n", plan)), 0o644); err != nil {
					return err
				}
			}
		}
		unix.Sync()
		d, err := e.timeSbx(state, "commit", "--plan", plan)
		if err != nil {
			return err
		}
		e.logf("-- plan rep %d/%d: commit %.3f s", rep+1, e.opt.reps, d)
		e.res.add("plan", "commit", "sbxfs", d)
	}
	return nil
}

// benchMemory: RSS of the sbxfs servers (both transports) and the
// fuse-overlayfs server over the largest original (idle, after a walk,
// after the kernel forgets, after a second walk), then of a daemon with
// many idle sandboxes, for each sbxfs transport.
func (e *env) benchMemory() error {
	n := e.sz.lifeN[len(e.sz.lifeN)-1]
	orig, err := e.need(fmt.Sprintf("life-%d", n))
	if err != nil {
		return err
	}
	for _, t := range e.targets {
		if t.kind == kindSbxfs || t.kind == kindFuseOverlay {
			e.logf("-- memory: %s", t.name)
			if err := e.memoryWalk(t, orig); err != nil {
				if e.ctx.Err() != nil {
					return e.ctx.Err()
				}
				e.logf("memory on %s failed: %v", t.name, err)
				e.res.addError("memory", t.name, err)
			}
		}
	}
	for _, t := range e.targets {
		if t.kind != kindSbxfs {
			continue
		}
		e.logf("-- memory: daemon with %d sandboxes, %s", e.sz.idleSandboxes, t.name)
		if err := e.memoryDaemon(t); err != nil {
			if e.ctx.Err() != nil {
				return e.ctx.Err()
			}
			e.logf("memory (daemon) on %s failed: %v", t.name, err)
			e.res.addError("memory", t.name+" daemon", err)
		}
	}
	return nil
}

func (e *env) memoryWalk(t *target, orig string) (err error) {
	in, err := e.open(t, orig, readOnly)
	if err != nil {
		return err
	}
	defer closeInto(in, &err)
	pid := in.serverPID()
	if pid == 0 {
		return fmt.Errorf("no server process for %s", in.mnt)
	}
	rss := func(row string) error {
		v, err := vmRSS(pid)
		if err == nil {
			e.res.add("memory", row, t.name, v)
		}
		return err
	}
	if err := e.dropCaches(3); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	if err := rss("idle"); err != nil {
		return err
	}
	d, err := timeFn(func() error { return e.walk(in.path) })
	if err != nil {
		return err
	}
	e.res.add("memory", "walktime", t.name, d)
	if err := rss("walk1"); err != nil {
		return err
	}
	if err := e.dropCaches(2); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	if err := rss("forget"); err != nil {
		return err
	}
	if err := e.walk(in.path); err != nil {
		return err
	}
	return rss("walk2")
}

// walk lstats every entry of a tree.
func (e *env) walk(root string) error {
	var st unix.Stat_t
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.ctx.Err() != nil {
			return e.ctx.Err()
		}
		return unix.Lstat(p, &st)
	})
}

// memoryDaemon measures a daemon whose sandboxes serve their requests
// through t's transport: for sbxfs it is started with --no-io-uring, for
// sbxfs-uring without, while enable_uring is Y (as the run has it). Its
// io_uring instances say which transport its sandboxes got.
func (e *env) memoryDaemon(t *target) error {
	name, flags := "memory", []string{"--no-io-uring"}
	if t.uring {
		name, flags = "uring-memory", nil // not a prefix of the other (isDaemonOf)
	}
	state, pid, stop, err := e.startDaemon(name, flags...)
	if err != nil {
		return err
	}
	defer stop()
	orig, err := e.need(fmt.Sprintf("life-%d", e.sz.lifeN[0]))
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	idle, err := vmRSS(pid)
	if err != nil {
		return err
	}
	var creates []float64
	for i := 0; i < e.sz.idleSandboxes; i++ {
		if t.uring && e.managesURing() {
			if err := e.uringParamIs("Y"); err != nil {
				return fmt.Errorf("before sandbox %d: %w", i+1, err)
			}
		}
		d, err := e.timeSbx(state, "create", "--plan", "idle", orig)
		if err != nil {
			return fmt.Errorf("sandbox %d: %w", i+1, err)
		}
		creates = append(creates, d)
	}
	time.Sleep(time.Second)
	loaded, err := vmRSS(pid)
	if err != nil {
		return err
	}
	// The daemon logs each sandbox's transport as it mounts it.
	mounted, err := daemonTransports(state)
	if err != nil {
		return err
	}
	want := "/dev/fuse"
	if t.uring {
		want = "io_uring"
	}
	if mounted[want] != e.sz.idleSandboxes {
		return fmt.Errorf("%s is not what it claims to measure: the daemon mounted %v for %d sandboxes (%s)",
			t.name, mounted, e.sz.idleSandboxes, uringParamNow())
	}
	rings, err := uringRings(pid)
	if err != nil {
		return err
	}
	e.logf("-- memory: the %s daemon holds %d io_uring instances for %d sandboxes", t.name, rings, e.sz.idleSandboxes)
	e.res.add("memory", "daemon.idle", t.name, idle)
	for _, d := range creates {
		e.res.add("memory", "daemon.create", t.name, d)
	}
	e.res.add("memory", "daemon.loaded", t.name, loaded)
	e.res.add("memory", "daemon.per", t.name, (loaded-idle)/float64(e.sz.idleSandboxes))
	d, err := e.timeSbx(state, "destroy", "--plan", "idle")
	if err != nil {
		return err
	}
	e.res.add("memory", "daemon.destroy", t.name, d)
	return nil
}
