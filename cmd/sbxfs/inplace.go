package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/manager"
)

// 'sbxfs run --in-place' shows the sandbox to CMD at ORIGINAL's own path,
// so that what tools record of their paths (a virtual environment's
// scripts, a build directory's cache, a linked worktree's gitdir) names
// ORIGINAL and still holds once the changes are committed there. It starts
// sbxfs again in a mount namespace of its own, whose mounts are slaves of
// the machine's (nothing mounted there reaches the rest of the machine);
// that process binds the sandbox's mount over ORIGINAL, enters the working
// directory and becomes CMD. The environment variable inPlaceEnv tells it
// so (inPlaceSpec as JSON). docs/manager.md has the whole design.
const inPlaceEnv = "SBXFS_IN_PLACE_EXEC"

// inPlaceSpec is what the in-place process binds and where it starts CMD.
type inPlaceSpec struct {
	Mountpoint string `json:"mountpoint"` // the sandbox's mount
	Original   string `json:"original"`   // where it is bound
	Dir        string `json:"dir"`        // CMD's working directory
	// View is where the original itself is bound, read-only, before the
	// sandbox covers it: sbxfs run by CMD reads it there (status, diff,
	// resolve: see sandbox.uncover). Empty for none.
	View string `json:"view,omitempty"`
}

// MarshalJSON writes the spec's paths byte for byte (fsutil.EncodeRaw).
func (s inPlaceSpec) MarshalJSON() ([]byte, error) {
	type plain inPlaceSpec
	p := plain(s)
	fsutil.EncodeRawFields(&p.Mountpoint, &p.Original, &p.Dir, &p.View)
	return json.Marshal(p)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *inPlaceSpec) UnmarshalJSON(b []byte) error {
	type plain inPlaceSpec
	if err := json.Unmarshal(b, (*plain)(s)); err != nil {
		return err
	}
	return fsutil.DecodeRawFields(&s.Mountpoint, &s.Original, &s.Dir, &s.View)
}

// inPlaceCommand is the process that becomes argv with the sandbox bound
// over its original. It has a mount namespace of its own, whose mounts it
// makes slaves of the machine's (the bind stays there; the machine's
// mounts still arrive); as a user other than root a user namespace too,
// mapping only the user's own ids, with CAP_SYS_ADMIN there kept across
// execve for the bind.
func inPlaceCommand(spec inPlaceSpec, argv []string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the sbxfs binary: %w", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, argv...)
	cmd.Env = append(os.Environ(), inPlaceEnv+"="+string(b))
	if os.Geteuid() == 0 {
		// Cloneflags, not Unshareflags: Go would make every mount private,
		// and mounts the daemon makes later (a sandbox CMD creates) would
		// not reach CMD. inPlaceExec makes them slaves instead.
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	} else {
		uid, gid := os.Getuid(), os.Getgid()
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
			GidMappingsEnableSetgroups: false,
			// Capabilities in the new user namespace do not survive
			// execve for a uid other than 0: keep the one the bind
			// needs (inPlaceExec drops it before CMD).
			AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN},
		}
	}
	return cmd, nil
}

// ownMountNamespace reports whether this process has a mount namespace of
// its own, not its parent's, as 'sbxfs run --in-place' starts it (true
// when the parent's cannot be read: nothing to tell by).
func ownMountNamespace() bool {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return true
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	return err != nil || parent != self
}

// inPlaceExec is the in-place process: it binds the sandbox over its
// original, enters the working directory and becomes argv. It returns
// only when it cannot, with the status 'sbxfs run' documents: 127 when
// CMD is not found, 126 when it cannot be run (or the bind fails).
func inPlaceExec(specJSON string, argv []string, stderr io.Writer) int {
	os.Unsetenv(inPlaceEnv) // not CMD's
	if !ownMountNamespace() {
		// Left in an environment passed on (sudo -E, say): what follows
		// would change the propagation of the machine's own mounts.
		fmt.Fprintf(stderr, "sbxfs: %s is set, but this process is not the in-place process of 'sbxfs run' (it shares its parent's mount namespace): unset it\n", inPlaceEnv)
		return 126
	}
	var spec inPlaceSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil || len(argv) == 0 {
		fmt.Fprintf(stderr, "sbxfs: run --in-place: bad request from the parent (%v)\n", err)
		return 126
	}
	// Slaves: the machine's mounts and unmounts still reach CMD, and
	// nothing mounted here (the bind first) reaches the machine.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		fmt.Fprintf(stderr, "sbxfs: run --in-place: make the mounts of CMD's namespace slaves: %v; run without --in-place\n", err)
		return 126
	}
	if spec.View != "" {
		showOriginal(spec.Original, spec.View)
	}
	if err := unix.Mount(spec.Mountpoint, spec.Original, "", unix.MS_BIND, ""); err != nil {
		fmt.Fprintf(stderr, "sbxfs: run --in-place: bind the sandbox %s over %s: %v; run without --in-place\n", spec.Mountpoint, spec.Original, err)
		return 126
	}
	// CMD gets no capability of ours (a user's in-place process holds
	// CAP_SYS_ADMIN of its user namespace for the bind).
	if err := dropInheritable(); err != nil {
		fmt.Fprintf(stderr, "sbxfs: run --in-place: drop capabilities: %v\n", err)
		return 126
	}
	if err := os.Chdir(spec.Dir); err != nil {
		fmt.Fprintf(stderr, "sbxfs: run %s: %v\n", argv[0], err)
		return 126
	}
	os.Setenv("PWD", spec.Dir) // the parent's is where sbxfs run was started
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(stderr, "sbxfs: run %s: %v\n", argv[0], err)
		return 127
	}
	err = syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(stderr, "sbxfs: run %s: %v\n", argv[0], err)
	if os.IsNotExist(err) {
		return 127
	}
	return 126
}

// showOriginal binds the original orig at view, read-only, for sbxfs run
// by CMD: there the sandbox covers orig. Read-only, so that nothing in
// CMD's namespace writes the original through it (an rm -r of the state
// root there would otherwise empty the original). Recursive, as a user
// namespace allows no other bind of a tree with mounts beneath it. A view
// that cannot be made is left out: sbxfs run by CMD then says the
// original is covered.
func showOriginal(orig, view string) {
	if err := os.Mkdir(view, 0o700); err != nil && !os.IsExist(err) {
		return
	}
	if err := unix.Mount(orig, view, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return
	}
	ro := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(unix.AT_FDCWD, view, unix.AT_RECURSIVE, ro); err != nil {
		unix.Unmount(view, unix.MNT_DETACH) // not without read-only
	}
}

// mountNamespace names the mount namespace of process pid ("" when it
// cannot be read: the process is gone).
func mountNamespace(pid int) string {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return ""
	}
	return ns
}

// processesIn lists the processes in the mount namespace ns.
func processesIn(ns string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if mountNamespace(pid) == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// inPlaceDir is CMD's working directory under --in-place: the current
// directory when it lies in the original (the sandbox shows it at the
// same path), else the original.
func inPlaceDir(orig string) string {
	if wd := workingDir(); wd != "" && within(wd, orig) {
		return wd
	}
	return orig
}

// dropInheritable clears the ambient and inheritable capabilities, which
// would otherwise pass to CMD's descendants.
func dropInheritable() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	if data[0].Inheritable == 0 && data[1].Inheritable == 0 {
		return nil
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	return unix.Capset(&hdr, &data[0])
}

// daemonPath gives the absolute path p of this process's mount namespace
// as the daemon sees it. In CMD's namespace of 'sbxfs run --in-place' a
// managed sandbox's mount is bound over its original, where the daemon
// (as every process outside) sees the original itself: a sandbox created
// there from a path in it would sandbox the original and commit straight
// to it, past the sandbox CMD works in. Through the sandbox's recorded
// mountpoint it is a sandbox of that sandbox (nested) instead.
func daemonPath(p string) string {
	rp, err := filepath.EvalSymlinks(p)
	if err != nil {
		rp = p
	}
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return p
	}
	under := fsutil.MountContaining(mounts, rp)
	if under == nil || !isSbxfs(under) {
		return p
	}
	root, id := managedWork(under.Source)
	if id == "" {
		return p
	}
	mnt, ok := manager.RecordedMountpoint(root, id)
	if !ok || mnt == under.Mountpoint {
		return p
	}
	rel, err := filepath.Rel(under.Mountpoint, rp)
	if err != nil {
		return p
	}
	return filepath.Join(mnt, under.Root, rel)
}

// seenHere reports whether the mount of the managed sandbox sb is seen in
// this process's mount namespace. The daemon mounts in its own: a process
// in a namespace of its own (CMD of 'sbxfs run --in-place') sees mounts
// made after its namespace was only where the machine's mounts propagate
// (shared, as systemd makes them).
func seenHere(sb manager.Sandbox) bool {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return true // nothing to tell by
	}
	e := fsutil.MountAt(mounts, sb.Mountpoint)
	return e != nil && isSbxfs(e) && e.Source == sb.Work
}

// notSeenHere says why a sandbox's mount is not seen here.
func notSeenHere(sb manager.Sandbox) string {
	return fmt.Sprintf("the daemon mounted the sandbox %s at %s, but this process's mount namespace does not see that mount (it is a namespace of its own, as CMD of 'sbxfs run --in-place' has, and the machine's mounts are private, not shared as systemd makes them): use it from outside this namespace",
		sb.ID, sb.Mountpoint)
}
