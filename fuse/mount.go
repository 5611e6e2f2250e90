// Package fuse serves a layers.Layers stack as a FUSE filesystem with
// go-fuse. It maps each FUSE operation onto layers and answers with an
// errno; the overlay logic (copy-up, whiteouts, journaling) lives in layers.
// It is the only package that imports go-fuse.
package fuse

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// Config describes one sandbox mount.
type Config struct {
	Layers     layers.Config
	Mountpoint string
	// FsName is shown as the mount's source in /proc/self/mountinfo;
	// status and unmount find the sandbox's work directory from it.
	FsName string
	// AllowOther lets other users use the mount (subject to the usual
	// permission checks, which the kernel makes: default_permissions).
	AllowOther bool
	// NoPassthrough turns FUSE passthrough off for upper files.
	NoPassthrough bool
	// NoIOUring keeps requests on /dev/fuse where the kernel would let
	// them go through io_uring (uring_serve.go).
	NoIOUring bool
	// Suid and Dev lift the nosuid and nodev defaults.
	Suid, Dev bool
	// Timeouts for the kernel's entry, attribute and negative caches.
	EntryTimeout, AttrTimeout, NegativeTimeout time.Duration
	Debug                                      bool
	Logger                                     *slog.Logger
}

// DefaultTimeout is the default lifetime of the kernel's caches. sbxfs is
// the only writer of the upper layer, so only changes made to the original
// behind the sandbox's back can be seen late, by at most this much.
const DefaultTimeout = 30 * time.Second

// entryTimeout is the lifetime of the kernel's entries.
func (cfg Config) entryTimeout() time.Duration {
	if cfg.EntryTimeout == 0 {
		return DefaultTimeout
	}
	return cfg.EntryTimeout
}

// lowerDirHold is how long the server keeps a directory of the original
// it opened for a read, for the next reads there.
const lowerDirHold = time.Second

// Server is a mounted sandbox.
type Server struct {
	freezeMu   sync.Mutex // serialises Freeze, Thaw and Reset
	invalidate bool       // a Reset left kernel caches to drop at Thaw
	srv        *gofuse.Server
	uring      *uringTransport // nil: requests come through /dev/fuse
	dev        *devLoop        // nil: go-fuse's loop reads /dev/fuse
	fs         *filesystem
	layers     *layers.Layers
	mnt        string
	stDev      uint64 // the mount's device number (CutOff), 0 when unknown
	// conn holds the mount's FUSE connection (CutOff); nil where it
	// cannot be opened (not root, no fusectl).
	conn *fsutil.FuseConn
}

// ErrMount wraps every failure to mount.
var ErrMount = errors.New("mount failed")

// Mount opens the layers and mounts them at cfg.Mountpoint. The mount is
// live when Mount returns.
func Mount(cfg Config) (*Server, error) {
	l, err := layers.Open(cfg.Layers)
	if err != nil {
		return nil, err
	}
	// Lower reads come in bursts in one directory (ls -l): keep the
	// directories they open for a moment, never longer than the kernel
	// keeps the entries it looked up (layers/lowerdirs.go).
	l.HoldLowerDirs(min(cfg.entryTimeout(), lowerDirHold))
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if n := l.Reconciled(); n > 0 {
		logger.Warn("the sandbox's last server stopped uncleanly: its change journal now names what the upper held and the journal did not", "records_added", n)
	}
	l.OnJournalCompact(func(r layers.CompactResult) {
		if r.Err != nil {
			logger.Error("journal compaction failed (the journal is as it was unless the error says otherwise)", "err", r.Err)
			return
		}
		logger.Info("journal compacted", "before", r.Before, "after", r.After, "dead_paths_dropped", r.Dropped, "took", r.Took.Round(time.Millisecond))
	})
	fsys := &filesystem{layers: l, log: logger, passthrough: !cfg.NoPassthrough, cookieSeed: maphash.MakeSeed(),
		layersMayStall: mayStall(append([]string{cfg.Layers.Upper, cfg.Layers.Work}, cfg.Layers.Lowers...)...)}
	root, err := fsys.newRoot()
	if err != nil {
		l.Close()
		return nil, err
	}
	opts := fsys.options(cfg)
	// The root reports the upper root's stable inode number like every
	// other node (go-fuse would report 0).
	opts.RootStableAttr = &fusefs.StableAttr{Ino: fsys.rootIno, Mode: unix.S_IFDIR}
	srv, uring, dev, err := fsys.mount(cfg.Mountpoint, root, opts)
	if err != nil && opts.DirectMount {
		opts.DirectMount = false // fall back to fusermount3
		srv, uring, dev, err = fsys.mount(cfg.Mountpoint, root, opts)
	}
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("%w at %s: %v", ErrMount, cfg.Mountpoint, err)
	}
	fsys.startFlusher()
	s := &Server{srv: srv, uring: uring, dev: dev, fs: fsys, layers: l, mnt: cfg.Mountpoint}
	var st unix.Stat_t
	if unix.Stat(cfg.Mountpoint, &st) == nil {
		s.stDev = st.Dev
		s.conn, _ = fsutil.OpenFuseConn(st.Dev)
		raiseReadahead(st.Dev)
	}
	return s, nil
}

// mount serves root at mnt (fusefs.Mount, with READDIR replies sized
// for the directory handles and umasks passed on: rawFS) and returns once
// the mount is live, with its io_uring queues if the kernel took them, or
// else the devLoop that serves /dev/fuse. go-fuse's own loop serves
// /dev/fuse beside io_uring (FORGET and INTERRUPT come that way), and for
// layers that may stall (devLoop's readers would wait on them; go-fuse
// starts a reader for every request that does).
func (fs *filesystem) mount(mnt string, root *node, opts *fusefs.Options) (*gofuse.Server, *uringTransport, *devLoop, error) {
	raw := &rawFS{RawFileSystem: fusefs.NewNodeFS(root, opts), replies: &fs.replies, umasks: &fs.umasks, kills: &fs.kills}
	srv, err := gofuse.NewServer(raw, mnt, &opts.MountOptions)
	if err != nil {
		return nil, nil, nil, err
	}
	var uring *uringTransport
	if opts.ExtraCapabilities&gofuse.CAP_OVER_IO_URING != 0 && srv.KernelSettings().Flags64()&gofuse.CAP_OVER_IO_URING != 0 {
		uring, err = startURing(fs, raw, srv, &opts.MountOptions)
		if errors.Is(err, errURingStuck) {
			go srv.Serve()
			_ = srv.Unmount()
			return nil, nil, nil, fmt.Errorf("%v; mount with --no-io-uring, or turn the kernel's enable_uring off", err)
		}
		if err != nil {
			fs.log.Warn("io_uring refused; requests go through /dev/fuse", "err", err)
		}
	}
	var dev *devLoop
	if uring == nil && !fs.layersMayStall {
		if dev, err = startDevLoop(fs, raw, srv, &opts.MountOptions); err != nil {
			fs.log.Warn("serving /dev/fuse with go-fuse's loop", "err", err)
		}
	}
	if dev == nil {
		go srv.Serve()
	}
	if err := srv.WaitMount(); err != nil {
		return nil, nil, nil, err
	}
	return srv, uring, dev, nil
}

// mayStall reports whether any of dirs is on a filesystem whose calls may
// wait on something other than a local disk (or cannot be told): FUSE,
// which may be a mount this very process serves, and network filesystems,
// whose server may stop answering.
func mayStall(dirs ...string) bool {
	for _, d := range dirs {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil {
			return true
		}
		switch uint32(st.Type) {
		case unix.FUSE_SUPER_MAGIC, unix.NFS_SUPER_MAGIC, unix.SMB_SUPER_MAGIC,
			unix.CIFS_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC, unix.V9FS_MAGIC,
			unix.CEPH_SUPER_MAGIC, unix.AFS_SUPER_MAGIC, unix.AFS_FS_MAGIC,
			unix.CODA_SUPER_MAGIC, unix.OCFS2_SUPER_MAGIC:
			return true
		}
	}
	return false
}

// Transport says how the kernel's requests reach the server: "io_uring"
// or "/dev/fuse".
func (s *Server) Transport() string {
	if s.uring != nil && s.uring.active {
		return "io_uring"
	}
	return "/dev/fuse"
}

// URingRequests is the number of requests answered through io_uring.
func (s *Server) URingRequests() uint64 {
	if s.uring == nil {
		return 0
	}
	return s.uring.served.Load()
}

// DevHelpers is the number of readers a /dev/fuse mount started for
// lookups that queued up behind one being answered.
func (s *Server) DevHelpers() uint64 {
	if s.dev == nil {
		return 0
	}
	return s.dev.helpers.Load()
}

// DevBuffersTrimmed is the number of times a /dev/fuse mount gave back
// the pages of a buffer a large request had left resident, once quiet.
func (s *Server) DevBuffersTrimmed() uint64 {
	if s.dev == nil {
		return 0
	}
	return s.dev.trimmed.Load()
}

// readaheadKB is the readahead of a mount. The kernel starts a FUSE mount
// at 128 KiB and INIT can only lower it; reads of original files go
// through sbxfs (never passthrough), and at 128 KiB a cold sequential read
// runs at a third of the disk's speed.
const readaheadKB = 1024

// raiseReadahead sets the mount's readahead through sysfs (root only;
// without it the kernel's default stays).
func raiseReadahead(dev uint64) {
	if os.Geteuid() != 0 {
		return
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(dev), unix.Minor(dev))
	_ = os.WriteFile(p, []byte(strconv.Itoa(readaheadKB)), 0)
}

func (fs *filesystem) options(cfg Config) *fusefs.Options {
	entry, attr, neg := cfg.entryTimeout(), cfg.AttrTimeout, cfg.NegativeTimeout
	if attr == 0 {
		attr = DefaultTimeout
	}
	if neg == 0 {
		neg = DefaultTimeout
	}
	fs.attrTimeout = attr
	// go-fuse's direct mount starts from MS_NOSUID|MS_NODEV and clears
	// them only for an explicit "suid" or "dev"; fusermount3 takes either.
	mo := []string{"default_permissions", "nosuid", "nodev"}
	if cfg.Suid {
		mo[1] = "suid"
	}
	if cfg.Dev {
		mo[2] = "dev"
	}
	fsname := cfg.FsName
	if fsname == "" {
		fsname = "sbxfs"
	}
	o := &fusefs.Options{
		MountOptions: gofuse.MountOptions{
			AllowOther:    cfg.AllowOther,
			Options:       mo,
			FsName:        fsname,
			Name:          "sbxfs",
			DirectMount:   os.Geteuid() == 0,
			Debug:         cfg.Debug,
			MaxReadAhead:  readaheadKB << 10,
			MaxWrite:      maxRequest(), // and max_read
			MaxBackground: 64,
			// POSIX ACLs count in the kernel's permission checks
			// (default_permissions alone checks the mode bits only, so
			// an entry denying a user was ignored), and setting one
			// updates the mode, as on ext4.
			EnableAcl: true,
			// The kernel leaves the umask to sbxfs (umask.go), and
			// clearing set-user-ID bits on writes (killpriv.go).
			ExtraCapabilities: gofuse.CAP_DONT_MASK | gofuse.CAP_HANDLE_KILLPRIV_V2,
		},
		// go-fuse would turn permission bits 0 into 0644 (0755 for
		// directories); a mode 0 file must stay mode 0.
		NullPermissions: true,
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &neg,
		Logger:          log.New(io.Discard, "", 0),
	}
	if !cfg.NoIOUring && uringEnabled() {
		o.MountOptions.ExtraCapabilities |= gofuse.CAP_OVER_IO_URING
	}
	if cfg.Debug {
		o.Logger = log.New(os.Stderr, "sbxfs: ", log.LstdFlags)
		o.MountOptions.Logger = o.Logger
	}
	return o
}

// Wait blocks until the mount is unmounted (by Unmount, umount(8) or
// fusermount3 -u), then flushes and closes the journal.
func (s *Server) Wait() error {
	s.srv.Wait()
	if s.dev != nil {
		s.dev.wait()
	}
	if s.uring != nil && !s.uring.wait(10*time.Second) {
		s.fs.log.Warn("io_uring queues still running after unmount")
	}
	s.fs.stopFlusher()
	if s.conn != nil {
		s.conn.Close()
	}
	return s.layers.Close()
}

// Unmount unmounts the sandbox. It fails with EBUSY while the mount is in
// use (a file open, a working directory in it); a frozen mount then stays
// frozen, so a commit that cannot unmount resets the sandbox with no
// change slipping in between. Once unmounted it is thawed: no process can
// be waiting at the gate of a mount nothing uses. A copy of the mount that
// outlives the unmount (another mount namespace's, a bind mount) is cut
// off (CutOff): the server finishes. One that a process uses makes the
// mount busy as a process here would (InUseElsewhere).
func (s *Server) Unmount() error {
	if err := s.InUseElsewhere(); err != nil {
		return err
	}
	// go-fuse's Unmount waits for its own loops (io_uring, layers that
	// may stall) to end, which a copy elsewhere would keep running.
	done := make(chan error, 1)
	go func() { done <- s.srv.Unmount() }()
	tick := time.NewTicker(cutOffWait)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				// go-fuse falls back to fusermount3, whose message is
				// all that says why.
				if strings.Contains(err.Error(), "busy") {
					err = syscall.EBUSY
				}
				return fmt.Errorf("unmount %s: %w", s.mnt, err)
			}
			s.CutOff()
			s.Thaw()
			return nil
		case <-tick.C:
			if !s.mountedHere() {
				s.CutOff()
			}
		}
	}
}

// Layers returns the overlay stack the mount serves.
func (s *Server) Layers() *layers.Layers { return s.layers }

// Mountpoint is where the sandbox is mounted.
func (s *Server) Mountpoint() string { return s.mnt }
