package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fuse"
	"github.com/sbxfs/sbxfs/layers"
	"github.com/sbxfs/sbxfs/manager"
)

// mountSpec is a checked mount request, ready to serve.
type mountSpec struct {
	cfg fuse.Config
	// announce is printed on stdout once the mount is live.
	announce string
	// live is set once this process has the mount up.
	live bool
}

// bindLayers records the layers in the work directory, or refuses a work
// directory made for other layers. cfg takes the recorded xattr namespace.
func bindLayers(cfg *layers.Config) error {
	err := layers.Bind(cfg)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, layers.ErrMetaMismatch) && recordedOriginalGone(cfg.Work):
		return failf(exitBadPath, "%v; if the original was moved to %s, mount with --moved to record its new place", err, cfg.Lowers[0])
	case errors.Is(err, layers.ErrMetaMismatch), errors.Is(err, layers.ErrMetaVersion):
		return &exitError{code: exitBadPath, err: err}
	}
	return fmt.Errorf("record the sandbox layers: %w", err)
}

// recordedOriginalGone reports whether the original recorded in work is
// no longer where it was.
func recordedOriginalGone(work string) bool {
	m, err := layers.ReadMeta(work)
	if err != nil {
		return false
	}
	_, err = os.Lstat(m.Lowers[0])
	return errors.Is(err, os.ErrNotExist)
}

// rebindLayers records ORIGINAL as the new place of a sandbox's moved
// original (mount --moved).
func rebindLayers(cfg *layers.Config) error {
	if manager.IsManagedDir(filepath.Dir(cfg.Work)) {
		return failf(exitBadPath, "--moved: %s is a managed sandbox: record its original's new place with 'sbxfs mount --moved NEWPLACE %s'", filepath.Dir(cfg.Work), filepath.Base(filepath.Dir(cfg.Work)))
	}
	err := layers.Rebind(cfg)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrNotExist):
		return failf(exitNotSbxfs, "--moved: %s holds no sandbox record; give the --upper DIR of an existing sandbox", filepath.Dir(cfg.Work))
	case errors.Is(err, layers.ErrStillThere):
		return failf(exitBadPath, "--moved: %v; that is another original: mount the sandbox over its own", err)
	case errors.Is(err, layers.ErrMetaMismatch), errors.Is(err, layers.ErrMetaVersion):
		return &exitError{code: exitBadPath, err: err}
	}
	return fmt.Errorf("record the new place of the original: %w", err)
}

// mountFailure gives the error of fuse.Mount its exit code and a hint.
func mountFailure(err error, cfg *fuse.Config) error {
	msg := strings.TrimSpace(err.Error()) // go-fuse ends some messages with a newline
	switch {
	case errors.Is(err, layers.ErrCrossDevice):
		return failf(exitBadPath, "%s; put the work directory on the same mount as the upper directory", msg)
	case errors.Is(err, layers.ErrBadConfig):
		return failf(exitBadPath, "%s; check the directories", msg)
	case errors.Is(err, fuse.ErrMount) && cfg.AllowOther && os.Geteuid() != 0:
		return failf(exitMountFailed, "%s; allow_other needs user_allow_other in /etc/fuse.conf (scripts/install-deps.sh adds it)", msg)
	case errors.Is(err, fuse.ErrMount):
		return failf(exitMountFailed, "%s; see the server output, check that /dev/fuse exists and that fusermount3 is installed (scripts/install-deps.sh)", msg)
	}
	return err
}

// serve mounts spec in this process and serves it until it is unmounted,
// from outside or after SIGINT, SIGTERM or SIGHUP.
func serve(spec *mountSpec, stdout io.Writer) error {
	// The kernel sends the modes it wants applied; do not mask them.
	unix.Umask(0)
	serverProcs()
	work := spec.cfg.Layers.Work
	pid, err := lockPidFile(work)
	if err != nil {
		return err
	}
	defer pid.release()
	level := slog.LevelInfo
	if spec.cfg.Debug {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	spec.cfg.Logger = logger
	// Catch signals before mounting: a SIGTERM that killed this process
	// while go-fuse polls its own new mount would leave a thread waiting
	// on a server that can no longer answer, and the process could never
	// finish exiting.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	stopProfile, err := startProfile()
	if err != nil {
		return err
	}
	defer stopProfile()
	srv, err := fuse.Mount(spec.cfg)
	if err != nil {
		return mountFailure(err, &spec.cfg)
	}
	spec.live = true
	ctl, err := manager.ServeControl(work, srv)
	if err != nil {
		_ = srv.Unmount()
		_ = srv.Wait()
		return fmt.Errorf("serve the control socket: %w", err)
	}
	defer ctl.Close()
	logger.Info("mounted", "mountpoint", spec.cfg.Mountpoint, "lowers", spec.cfg.Layers.Lowers,
		"upper", spec.cfg.Layers.Upper, "pid", os.Getpid(), "transport", srv.Transport())
	if spec.announce != "" {
		fmt.Fprintln(stdout, spec.announce)
	}
	ready.ok()
	return waitServer(srv, logger, sigs)
}

// waitServer waits until the mount goes away; a signal unmounts it, lazily
// when files are still open.
func waitServer(srv *fuse.Server, logger *slog.Logger, sigs <-chan os.Signal) error {
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("close the sandbox journal: %w", err)
			}
			logger.Info("unmounted", "mountpoint", srv.Mountpoint(), "io_uring_requests", srv.URingRequests(),
				"lookup_helpers", srv.DevHelpers(), "buffers_trimmed", srv.DevBuffersTrimmed())
			return nil
		case s := <-sigs:
			logger.Info("unmounting", "signal", s.String())
			if err := srv.Unmount(); err != nil {
				logger.Warn("unmount failed; detaching lazily, the server exits once the last open file is closed", "err", err)
				if err := lazyDetach(srv.Mountpoint()); err != nil {
					logger.Error("lazy unmount failed", "err", err)
				}
			}
		}
	}
}

// lazyDetach detaches mnt from the file system tree now; the kernel ends
// the mount once nothing uses it any more.
func lazyDetach(mnt string) error {
	if os.Geteuid() == 0 {
		return unix.Unmount(mnt, unix.MNT_DETACH)
	}
	return fusermount("-u", "-z", mnt)
}

// fusermount runs fusermount3 with args; its message becomes the error.
func fusermount(args ...string) error {
	bin, err := exec.LookPath("fusermount3")
	if err != nil {
		if bin, err = exec.LookPath("fusermount"); err != nil {
			return fmt.Errorf("fusermount3 not found; install fuse3 (scripts/install-deps.sh)")
		}
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if strings.Contains(msg, "busy") {
			return fmt.Errorf("%s: %w", msg, unix.EBUSY)
		}
		if msg == "" {
			msg = err.Error()
		}
		return errors.New(msg)
	}
	return nil
}

// The pid file of a serving process, DIR/work/server.pid, holds its pid
// and an exclusive flock for as long as it serves: a second server of the
// same sandbox is refused, and unmount knows when the server has exited.
const pidFileName = "server.pid"

type pidFile struct {
	f    *os.File
	path string
}

// lockPidFile takes the pid file of the sandbox whose work directory is
// work, or says which process holds it.
func lockPidFile(work string) (*pidFile, error) {
	path := filepath.Join(work, pidFileName)
	for range 5 {
		// Never through a symlink (planted, it would have this process
		// truncate and write some other file), never blocking on a FIFO.
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
		if err == nil {
			if st, serr := f.Stat(); serr == nil && !st.Mode().IsRegular() {
				f.Close()
				err = fmt.Errorf("not a regular file (%v)", st.Mode().Type())
			}
		}
		if err != nil {
			return nil, failf(exitBadPath, "pid file %s: %v; it must be a regular file: remove it", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			b, _ := io.ReadAll(f)
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, failf(exitBusy, "sandbox %s is already served by process %s; unmount its mount first",
					filepath.Dir(work), strings.TrimSpace(string(b)))
			}
			return nil, fmt.Errorf("lock pid file: %w", err)
		}
		// The previous holder may have removed the file between our open
		// and our lock: then the lock is on a dead inode; start over.
		var fst, pst unix.Stat_t
		if unix.Fstat(int(f.Fd()), &fst) == nil && unix.Stat(path, &pst) == nil && fst.Ino == pst.Ino && fst.Dev == pst.Dev {
			p := &pidFile{f: f, path: path}
			err := f.Truncate(0)
			if err == nil {
				_, err = f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
			}
			if err != nil {
				p.release()
				return nil, fmt.Errorf("write pid file: %w", err)
			}
			return p, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("pid file %s keeps changing; is another server starting?", path)
}

func (p *pidFile) release() {
	_ = os.Remove(p.path)
	_ = p.f.Close()
}

// waitServerExit waits up to timeout until no process serves the sandbox
// whose work directory is work. It returns the pid still serving, or 0.
func waitServerExit(work string, timeout time.Duration) int {
	path := filepath.Join(work, pidFileName)
	return waitGone(timeout, func() (int, bool) {
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			return 0, true // removed by the exiting server, or unreadable: nothing to wait for
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		b, _ := io.ReadAll(f)
		f.Close()
		if err == nil {
			return 0, true // nobody holds it: the server is gone
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return pid, false
	})
}

// waitGone calls check until it says the process is gone or timeout has
// passed, waiting in between for the process check names to exit. It
// returns 0 once gone, else the last pid (at least 1).
func waitGone(timeout time.Duration, check func() (pid int, gone bool)) int {
	deadline := time.Now().Add(timeout)
	for {
		pid, gone := check()
		if gone {
			return 0
		}
		left := time.Until(deadline)
		if left <= 0 {
			return max(pid, 1)
		}
		if !waitExit(pid, left) {
			time.Sleep(min(left, 5*time.Millisecond))
		}
	}
}

// waitExit waits up to d for process pid to exit, on its pidfd: the server
// has exited the moment it does, where a poll of the pid file would see it
// up to a poll interval late. It returns false when it could not wait (no
// such process any more, or a kernel without pidfd_open).
func waitExit(pid int, d time.Duration) bool {
	if pid <= 0 {
		return false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(d); ; {
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		_, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err != unix.EINTR {
			return true
		}
	}
}
