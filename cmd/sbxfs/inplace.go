package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// 'sbxfs run --in-place' shows the sandbox to CMD at ORIGINAL's own path,
// so that what tools record of their paths (a virtual environment's
// scripts, a build directory's cache, a linked worktree's gitdir) names
// ORIGINAL and still holds once the changes are committed there. It starts
// sbxfs again in a mount namespace of its own, private (nothing it mounts
// reaches the rest of the machine); that process binds the sandbox's
// mount over ORIGINAL, enters the working directory and becomes CMD. The
// environment variable inPlaceEnv tells it so (inPlaceSpec as JSON).
const inPlaceEnv = "SBXFS_IN_PLACE_EXEC"

// inPlaceSpec is what the in-place process binds and where it starts CMD.
type inPlaceSpec struct {
	Mountpoint string `json:"mountpoint"` // the sandbox's mount
	Original   string `json:"original"`   // where it is bound
	Dir        string `json:"dir"`        // CMD's working directory
}

// inPlaceCommand is the process that becomes argv with the sandbox bound
// over its original. As root it has a mount namespace of its own (Go makes
// its mounts private, so the bind stays there); otherwise a user namespace
// too, mapping only the user's own ids, with CAP_SYS_ADMIN there kept
// across execve for the bind (its mounts are slaves of the machine's).
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
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
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

// inPlaceExec is the in-place process: it binds the sandbox over its
// original, enters the working directory and becomes argv. It returns
// only when it cannot, with the status 'sbxfs run' documents: 127 when
// CMD is not found, 126 when it cannot be run (or the bind fails).
func inPlaceExec(specJSON string, argv []string, stderr io.Writer) int {
	os.Unsetenv(inPlaceEnv) // not CMD's
	var spec inPlaceSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil || len(argv) == 0 {
		fmt.Fprintf(stderr, "sbxfs: run --in-place: bad request from the parent (%v)\n", err)
		return 126
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
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || strings.ContainsAny(e.Name(), "+-") {
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
