package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// env is one run of the benchmark: its options, the scratch disk, the
// generated originals, what is mounted, and the results.
type env struct {
	ctx context.Context
	opt options
	sz  sizes
	res *results
	// targets measured by this run, in report order (allTargets, less
	// sbxfs-uring where it cannot be measured: uring.go).
	targets []*target
	uring   uringState

	disk      string // scratch ext4 mountpoint
	diskWasUp bool
	work      string // disk/sbxfs-bench-run.PID: everything this run makes
	orig      string // work/orig: generated originals
	inst      string // work/inst: one directory per instance
	state     string // work/state: --state-dir of standalone mounts
	seq       int    // instance counter
	generated map[string]bool
	mu        sync.Mutex
	mounts    []*mountRec // live mounts and daemons, in creation order
	cleanedUp bool
	goBin     string

	metaFiles, copyupFiles, gitFiles []string // relative paths in the generated originals
}

// mountRec is something that must be undone before exit: a mount or a
// daemon. undo is called with a context that is never the run's.
type mountRec struct {
	what string
	undo func(ctx context.Context) error
	done bool
}

func newEnv(ctx context.Context, opt options) *env {
	return &env{ctx: ctx, opt: opt, sz: sizesFor(opt.quick), res: newResults(), generated: map[string]bool{},
		targets: append([]*target(nil), allTargets...)}
}

func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// setup brings up the scratch disk (remembering whether it was up),
// makes the run's work directory on it and sets the fuse module's
// enable_uring for sbxfs-uring (uring.go).
func (e *env) setup() error {
	for _, tool := range []string{"fio", "fuse-overlayfs", "git", "tar", "find", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found; run scripts/install-deps.sh (and put /usr/local/go/bin on PATH)", tool)
		}
	}
	e.goBin, _ = exec.LookPath("go")
	e.disk = os.Getenv("SBXFS_BENCH_MNT")
	if e.disk == "" {
		e.disk = "/mnt/sbxfs-bench"
	}
	e.diskWasUp = isMountpoint(e.disk)
	if !e.diskWasUp {
		e.logf("bringing up the scratch disk (scripts/bench-disk.sh up)")
		e.mounts = append(e.mounts, &mountRec{what: "scratch disk " + e.disk, undo: e.diskDown})
		out, err := exec.CommandContext(e.ctx, "bash", filepath.Join(e.opt.repo, "scripts", "bench-disk.sh"), "up").CombinedOutput()
		if err != nil {
			return fmt.Errorf("scripts/bench-disk.sh up: %v: %s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != e.disk {
			return fmt.Errorf("scripts/bench-disk.sh up printed %q, expected %s (set SBXFS_BENCH_MNT)", got, e.disk)
		}
	}
	e.removeStale()
	e.work = filepath.Join(e.disk, fmt.Sprintf("%s%d", runPrefix, os.Getpid()))
	if err := os.Mkdir(e.work, 0o755); err != nil {
		return err
	}
	e.orig, e.inst, e.state = filepath.Join(e.work, "orig"), filepath.Join(e.work, "inst"), filepath.Join(e.work, "state")
	for _, d := range []string{e.orig, e.inst, e.state} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	e.setupURing()
	e.res.machine = append(machineInfo(e), e.uringMachineRow())
	return nil
}

// runPrefix names a run's work directory on the scratch disk; the pid
// follows, so that runs side by side do not meet.
const runPrefix = "sbxfs-bench-run."

// removeStale unmounts and removes what runs that were killed left (work
// directories whose process is gone).
func (e *env) removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(e.disk, runPrefix+"*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), runPrefix))
		if err != nil || processAlive(pid) {
			continue
		}
		e.logf("removing %s, left by a run that was killed", d)
		e.restoreStaleURing(d)
		old := e.work
		e.work = d
		e.sweep(context.Background())
		if len(mountsUnder(d)) == 0 {
			os.RemoveAll(d)
		}
		e.work = old
	}
}

// diskDown removes the scratch disk this run brought up, unless something
// other than this run's directory appeared on it meanwhile.
func (e *env) diskDown(ctx context.Context) error {
	ents, _ := os.ReadDir(e.disk)
	for _, de := range ents {
		if de.Name() != "lost+found" && de.Name() != filepath.Base(e.work) {
			e.logf("leaving the scratch disk up: %s appeared on it while the benchmark ran", de.Name())
			return nil
		}
	}
	out, err := exec.CommandContext(ctx, "bash", filepath.Join(e.opt.repo, "scripts", "bench-disk.sh"), "down").CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/bench-disk.sh down: %v: %s", err, out)
	}
	return nil
}

// track records something to undo at exit; the returned function undoes
// it now (once).
func (e *env) track(what string, undo func(ctx context.Context) error) func() error {
	r := &mountRec{what: what, undo: undo}
	e.mu.Lock()
	e.mounts = append(e.mounts, r)
	e.mu.Unlock()
	return func() error {
		e.mu.Lock()
		if r.done {
			e.mu.Unlock()
			return nil
		}
		r.done = true
		e.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return r.undo(ctx)
	}
}

// cleanup undoes every live mount and daemon, newest first, then sweeps
// whatever is still mounted under the work directory, removes the work
// directory and, when this run brought it up, the scratch disk. It runs
// on every exit path (deferred in run), with its own context.
func (e *env) cleanup() {
	e.mu.Lock()
	if e.cleanedUp {
		e.mu.Unlock()
		return
	}
	e.cleanedUp = true
	recs := e.mounts
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var disk *mountRec
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		if r.done {
			continue
		}
		if strings.HasPrefix(r.what, "scratch disk") {
			disk = r
			continue
		}
		r.done = true
		if err := r.undo(ctx); err != nil {
			e.logf("cleanup: %s: %v", r.what, err)
		}
	}
	if e.work != "" {
		e.sweep(ctx)
		if left := mountsUnder(e.work); len(left) > 0 {
			e.logf("cleanup: still mounted, NOT removing %s: %v", e.work, left)
			return
		}
		if err := os.RemoveAll(e.work); err != nil {
			e.logf("cleanup: remove %s: %v", e.work, err)
		}
	}
	if disk != nil {
		disk.done = true
		if err := disk.undo(ctx); err != nil {
			e.logf("cleanup: %v", err)
		}
	}
}

// sweep stops daemons and unmounts everything under the work directory
// that is still there (from a killed earlier run, or a failed undo).
func (e *env) sweep(ctx context.Context) {
	if e.work == "" {
		return
	}
	locks, _ := filepath.Glob(filepath.Join(e.work, "daemon-*", "manager.lock"))
	for _, l := range locks {
		state := filepath.Dir(l)
		stopDaemon(daemonPID(state), state)
	}
	for _, m := range mountsUnder(e.work) { // deepest first
		if err := unix.Unmount(m, 0); err != nil {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				e.logf("sweep: unmount %s: %v", m, err)
				continue
			}
		}
		e.logf("sweep: unmounted %s", m)
	}
}

// mountsUnder lists the mountpoints at or below dir, deepest first.
func mountsUnder(dir string) []string {
	var ms []string
	for _, m := range readMounts() {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			ms = append(ms, m.point)
		}
	}
	sort.Slice(ms, func(i, j int) bool { return strings.Count(ms[i], "/") > strings.Count(ms[j], "/") })
	return ms
}

type mountEnt struct{ point, fstype, source string }

// readMounts parses /proc/self/mountinfo.
func readMounts() []mountEnt {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []mountEnt
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		out = append(out, mountEnt{point: unescapeMount(f[4]), fstype: f[sep+1], source: unescapeMount(f[sep+2])})
	}
	return out
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func isMountpoint(p string) bool {
	for _, m := range readMounts() {
		if m.point == p {
			return true
		}
	}
	return false
}

// dropCaches flushes dirty data and drops the page cache, dentries and
// inodes (level 3), or only dentries and inodes (level 2).
func (e *env) dropCaches(level int) error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte(strconv.Itoa(level)+"\n"), 0o200)
}

// cmdIn runs a command in dir with the run's context, output discarded
// (stderr kept for the error).
func (e *env) cmdIn(dir string, envv []string, name string, args ...string) error {
	_, err := e.output(dir, envv, name, args...)
	return err
}

// output runs a command and returns its stdout.
func (e *env) output(dir string, envv []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(e.ctx, name, args...)
	cmd.Dir = dir
	if envv != nil {
		cmd.Env = envv
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
}

// timeCmd runs a command (stdout to /dev/null) and returns its wall time
// in seconds.
func (e *env) timeCmd(dir string, envv []string, name string, args ...string) (float64, error) {
	cmd := exec.CommandContext(e.ctx, name, args...)
	cmd.Dir = dir
	if envv != nil {
		cmd.Env = envv
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start).Seconds()
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return d, nil
}

// timeFn returns the wall time of fn in seconds.
func timeFn(fn func() error) (float64, error) {
	start := time.Now()
	err := fn()
	return time.Since(start).Seconds(), err
}

// vmRSS returns the resident set of a process in bytes.
func vmRSS(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseFloat(f[0], 64)
				return kb * 1024, err
			}
		}
	}
	return 0, errors.New("no VmRSS")
}

// waitExit waits up to timeout for a process to be gone.
func waitExit(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !processAlive(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return !processAlive(pid)
}

// processAlive: the process exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// newInstDir makes a fresh directory for one instance.
func (e *env) newInstDir(tag string) (string, error) {
	e.seq++
	d := filepath.Join(e.inst, fmt.Sprintf("%04d-%s", e.seq, tag))
	return d, os.MkdirAll(d, 0o755)
}
