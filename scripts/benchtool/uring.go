package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// FUSE over io_uring (Linux 6.14+): the kernel offers it to a FUSE server
// only while the fuse module's parameter enable_uring is Y (default N),
// read when a mount starts. The sbxfs server takes it whenever it is
// offered, unless mounted with --no-io-uring (a daemon: started with
// --no-io-uring).
//
// A run saves the parameter, sets it to Y (so that sbxfs-uring can be
// measured), sets it to N for the lifecycle groups (create, diffcommit,
// plan: measured with sbxfs only, as they always were), and puts
// the saved value back when it ends, on every way out (a record of
// env.track). A run killed with SIGKILL leaves the saved value in its work
// directory; the next run puts it back (removeStale).
//
// Nothing stops another process from changing the parameter meanwhile
// (scripts/test does): the run never fights it, but every sbxfs mount and
// daemon checks which transport it really got and fails loudly when it is
// not the one its column claims.

const (
	uringParam     = "/sys/module/fuse/parameters/enable_uring"
	uringSavedFile = "enable_uring.saved" // in the run's work directory
)

// uringState is what a run did with enable_uring.
type uringState struct {
	saved string // the value before the run; "" when the run does not manage it
	want  string // the value the run last wrote
	skip  string // why sbxfs-uring is left out; "" when it is measured
}

// setupURing saves enable_uring and sets it to Y, or leaves sbxfs-uring
// out (with the reason) when the parameter is missing or cannot be
// written. It runs once the work directory exists.
func (e *env) setupURing() {
	leaveOut := func(why string) {
		e.uring.skip = why
		e.targets = withoutTarget(e.targets, uringTarget)
		e.logf("%s is left out: %s", uringTarget, why)
	}
	b, err := os.ReadFile(uringParam)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		leaveOut(fmt.Sprintf("this kernel has no FUSE over io_uring (no %s; it needs Linux 6.14+ built with CONFIG_FUSE_IO_URING)", uringParam))
		return
	case err != nil:
		leaveOut(fmt.Sprintf("cannot read %s: %v", uringParam, err))
		return
	}
	saved := strings.TrimSpace(string(b))
	if d, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); err == nil && strings.TrimSpace(string(d)) == "2" {
		leaveOut("io_uring is disabled for every process (kernel.io_uring_disabled = 2)")
		return
	}
	savedFile := filepath.Join(e.work, uringSavedFile)
	if err := os.WriteFile(savedFile, []byte(saved+"\n"), 0o644); err != nil {
		leaveOut(fmt.Sprintf("cannot record the value of %s: %v", uringParam, err))
		return
	}
	if err := os.WriteFile(uringParam, []byte("Y\n"), 0o644); err != nil {
		os.Remove(savedFile)
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		leaveOut(fmt.Sprintf("cannot write %s: %v", uringParam, err))
		return
	}
	e.uring.saved, e.uring.want = saved, "Y"
	e.track("enable_uring (restore "+saved+")", func(ctx context.Context) error { return e.restoreURing() })
	e.logf("%s was %s; set to Y for the run (restored at the end)", uringParam, saved)
}

// managesURing: the run saved enable_uring and may set it.
func (e *env) managesURing() bool { return e.uring.saved != "" }

// setURing sets enable_uring to v ("Y" or "N") when the run manages it.
func (e *env) setURing(v string) error {
	if !e.managesURing() {
		return nil
	}
	if cur := uringParamValue(); cur != e.uring.want {
		e.logf("warning: %s is %s, not %s as this run last set it: another process changed it", uringParam, cur, e.uring.want)
	}
	if err := os.WriteFile(uringParam, []byte(v+"\n"), 0o644); err != nil {
		return fmt.Errorf("set %s to %s: %w", uringParam, v, err)
	}
	e.uring.want = v
	return nil
}

// uringParamIs fails when enable_uring is not v, as it must be for the
// next mount.
func (e *env) uringParamIs(v string) error {
	if cur := uringParamValue(); cur != v {
		why := "this run does not manage it"
		if e.managesURing() {
			why = fmt.Sprintf("this run set it to %s: another process changed it (scripts/test toggles it)", e.uring.want)
		}
		return fmt.Errorf("%s is %s, not %s (%s)", uringParam, cur, v, why)
	}
	return nil
}

// restoreURing puts back the value enable_uring had before the run.
func (e *env) restoreURing() error {
	if cur := uringParamValue(); cur != e.uring.want {
		e.logf("warning: %s was %s at the end, not %s as this run last set it: another process changed it during the run", uringParam, cur, e.uring.want)
	}
	if err := os.WriteFile(uringParam, []byte(e.uring.saved+"\n"), 0o644); err != nil {
		return fmt.Errorf("restore %s to %s: %w", uringParam, e.uring.saved, err)
	}
	e.logf("%s restored to %s", uringParam, e.uring.saved)
	os.Remove(filepath.Join(e.work, uringSavedFile))
	return nil
}

// restoreStaleURing puts back the enable_uring value a killed run saved
// in its work directory dir.
func (e *env) restoreStaleURing(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, uringSavedFile))
	if err != nil {
		return
	}
	v := strings.TrimSpace(string(b))
	if v != "Y" && v != "N" {
		return
	}
	if err := os.WriteFile(uringParam, []byte(v+"\n"), 0o644); err != nil {
		e.logf("restoring %s to %s, as a killed run found it: %v", uringParam, v, err)
		return
	}
	e.logf("restored %s to %s, as the killed run %s found it", uringParam, v, filepath.Base(dir))
}

// uringParamValue is enable_uring's value, or "missing".
func uringParamValue() string {
	b, err := os.ReadFile(uringParam)
	if err != nil {
		return "missing"
	}
	return strings.TrimSpace(string(b))
}

// uringParamNow describes enable_uring for an error message.
func uringParamNow() string { return "enable_uring is " + uringParamValue() }

// serverTransport reads, from the server log path from offset start on,
// the transport of the "mounted" line ("io_uring" or "/dev/fuse").
func serverTransport(path string, start int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("server log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(start, 0); err != nil {
		return "", fmt.Errorf("server log: %w", err)
	}
	got := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.Contains(l, " msg=mounted ") {
			continue
		}
		got = "(none)"
		for _, field := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(field, "transport="); ok {
				got = strings.Trim(v, `"`)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("server log %s: %w", path, err)
	}
	if got == "" {
		return "", fmt.Errorf("no msg=mounted line in %s", path)
	}
	return got, nil
}

// daemonTransports counts the daemon's "sandbox mounted" log lines of
// state root by transport.
func daemonTransports(state string) (map[string]int, error) {
	b, err := os.ReadFile(filepath.Join(state, "daemon.log"))
	if err != nil {
		return nil, fmt.Errorf("daemon log: %w", err)
	}
	n := map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, `msg="sandbox mounted"`) {
			continue
		}
		for _, field := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(field, "transport="); ok {
				n[strings.Trim(v, `"`)]++
			}
		}
	}
	return n, nil
}

// uringRings counts the io_uring instances a process holds open.
func uringRings(pid int) (int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, de := range ents {
		if l, err := os.Readlink(filepath.Join(dir, de.Name())); err == nil && l == "anon_inode:[io_uring]" {
			n++
		}
	}
	return n, nil
}

// uringMachineRow describes what the run did with enable_uring, for the
// Machine table.
func (e *env) uringMachineRow() [2]string {
	const what = "FUSE over io_uring (fuse enable_uring)"
	if e.uring.skip != "" {
		return [2]string{what, uringTarget + " not measured: " + e.uring.skip}
	}
	var off []string
	for _, g := range groupOrder {
		if e.opt.only[g] && devFuseGroups[g] {
			off = append(off, g)
		}
	}
	if e.opt.only["memory"] {
		off = append(off, "the sbxfs daemon rows of memory")
	}
	v := fmt.Sprintf("was %s before the run; set to Y for it", e.uring.saved)
	if len(off) > 0 {
		v += ", but N for " + strings.Join(off, ", ")
	}
	v += fmt.Sprintf("; put back to %s when the run ended", e.uring.saved)
	return [2]string{what, v}
}
