package tests

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// envSoak sets how long TestSoakServerResources runs ("10m"); the
// default is short enough for CI.
const envSoak = "SBXFS_SOAK"

const defaultSoak = 60 * time.Second

// procSample is one look at the server process.
type procSample struct {
	at  time.Duration
	rss int64 // bytes
	fds int
}

func sampleProc(pid int) (procSample, error) {
	var s procSample
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return s, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			s.rss = kb << 10
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.fds = len(ents)
	return s, sc.Err()
}

// soakWorkload runs one round of mixed operations through the mount on
// a bounded set of names (so that what the server may legitimately keep,
// nodes of live names, stays bounded too), keeping up to maxOpen files
// open at once. It returns the number of operations and the first
// unexpected error.
type soakWorkload struct {
	root    string
	rng     *rand.Rand
	open    []*os.File
	maxOpen int
	ops     int
}

func (w *soakWorkload) name() string {
	return filepath.Join(w.root, fmt.Sprintf("d%d", w.rng.IntN(8)), fmt.Sprintf("f%02d", w.rng.IntN(40)))
}

// step does one operation; errors a racing namespace can give (ENOENT,
// EEXIST, ENOTEMPTY...) are part of the workload, anything else is
// returned.
func (w *soakWorkload) step() error {
	w.ops++
	p := w.name()
	var err error
	switch op := w.rng.IntN(16); op {
	case 0, 1:
		err = os.WriteFile(p, patterned(p, w.rng.IntN(48<<10)), 0o644)
	case 2:
		_, err = os.ReadFile(p)
	case 3:
		var f *os.File
		if f, err = os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0); err == nil {
			_, err = f.WriteString("more\n")
			if e := f.Close(); err == nil {
				err = e
			}
		}
	case 4:
		err = os.Rename(p, w.name())
	case 5:
		err = os.Remove(p)
	case 6:
		var st unix.Stat_t
		err = unix.Lstat(p, &st)
	case 7:
		var ents []os.DirEntry
		ents, err = os.ReadDir(filepath.Dir(p))
		_ = ents
	case 8:
		err = os.Chmod(p, os.FileMode(0o600|w.rng.IntN(0o100)))
	case 9:
		err = unix.Setxattr(p, "user.soak", []byte(strconv.Itoa(w.ops)), 0)
	case 10:
		err = os.Truncate(p, int64(w.rng.IntN(8<<10)))
	case 11:
		q := w.name()
		_ = os.Remove(q)
		err = os.Symlink(filepath.Base(p), q)
		if err == nil {
			_, err = os.Readlink(q)
		}
	case 12:
		q := w.name()
		_ = os.Remove(q)
		err = os.Link(p, q)
	case 13:
		// Copy-up of an original file (a bounded set).
		o := filepath.Join(w.root, "orig", fmt.Sprintf("o%02d", w.rng.IntN(50)))
		var f *os.File
		if f, err = os.OpenFile(o, os.O_WRONLY|os.O_TRUNC, 0); err == nil {
			_, err = f.WriteString(fmt.Sprintf("rewritten %d\n", w.ops))
			if e := f.Close(); err == nil {
				err = e
			}
		}
	case 14:
		// Hold a file open for a while: descriptors in flight.
		var f *os.File
		if f, err = os.Open(p); err == nil {
			w.open = append(w.open, f)
			if len(w.open) > w.maxOpen {
				i := w.rng.IntN(len(w.open))
				err = w.open[i].Close()
				w.open = append(w.open[:i], w.open[i+1:]...)
			}
		}
	case 15:
		d := filepath.Join(filepath.Dir(p), "sub")
		if err = os.Mkdir(d, 0o755); err == nil {
			err = os.WriteFile(filepath.Join(d, "x"), []byte("x"), 0o644)
		} else if os.IsExist(err) {
			err = os.RemoveAll(d)
		}
	}
	switch errnoOf(err) {
	case 0, unix.ENOENT, unix.EEXIST, unix.ENOTEMPTY, unix.EISDIR, unix.ENOTDIR, unix.ELOOP:
		return nil
	}
	return err
}

func (w *soakWorkload) closeAll() {
	for _, f := range w.open {
		f.Close()
	}
	w.open = nil
}

// TestSoakServerResources runs a mixed workload through one mount for
// $SBXFS_SOAK (default 60 s) and samples the server's resident memory
// and open descriptors: once the workload's files are closed the
// descriptors return to where they were before it, and after a warm-up
// the memory stays within a generous bound (2x + 32 MiB) of what it was.
func TestSoakServerResources(t *testing.T) {
	requireCLI(t)
	dur := defaultSoak
	if v := os.Getenv(envSoak); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSoak, v, err)
		}
		dur = d
	}
	files := map[string]string{}
	for i := range 50 {
		files[fmt.Sprintf("orig/o%02d", i)] = fmt.Sprintf("original %d\n", i)
	}
	for i := range 8 {
		files[fmt.Sprintf("d%d/", i)] = ""
	}
	orig := newOrig(t, files)
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	pid := sb.serverPid()
	if pid == 0 {
		t.Fatal("no server pid")
	}

	// Baseline: the idle server, after one look at the tree.
	_ = mustWalk(t, sb.mnt, viewOpts)
	time.Sleep(200 * time.Millisecond)
	base, err := sampleProc(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("soak for %v; idle server: rss %d KiB, %d fds", dur, base.rss>>10, base.fds)

	w := &soakWorkload{root: sb.mnt, rng: rand.New(rand.NewPCG(1, 2)), maxOpen: 32}
	start := time.Now()
	warm := min(dur/4, 30*time.Second)
	var samples []procSample
	var warmRSS int64
	next := time.Duration(0)
	for time.Since(start) < dur {
		for range 50 {
			if err := w.step(); err != nil {
				w.closeAll()
				t.Fatalf("operation %d failed: %v", w.ops, err)
			}
		}
		if el := time.Since(start); el >= next {
			s, err := sampleProc(pid)
			if err != nil {
				w.closeAll()
				t.Fatalf("sample the server: %v", err)
			}
			s.at = el
			samples = append(samples, s)
			if warmRSS == 0 && el >= warm {
				warmRSS = s.rss
			}
			// Descriptors in flight: the workload's open files (the
			// kernel may hold a few more being released) and nothing else.
			if s.fds > base.fds+w.maxOpen+16 {
				w.closeAll()
				t.Fatalf("at %v the server has %d fds open (idle %d, at most %d files open through the mount)", el, s.fds, base.fds, w.maxOpen)
			}
			next = el + dur/30
		}
	}
	w.closeAll()
	var b strings.Builder
	for _, s := range samples {
		fmt.Fprintf(&b, " %v:%dKiB/%dfd", s.at.Round(time.Second), s.rss>>10, s.fds)
	}
	t.Logf("%d operations in %v; samples:%s", w.ops, time.Since(start).Round(time.Second), b.String())

	// Every file is closed: the descriptors go back to the idle count
	// (the kernel releases FUSE files asynchronously: give it time).
	var last procSample
	deadline := time.Now().Add(10 * time.Second)
	for {
		if last, err = sampleProc(pid); err != nil {
			t.Fatal(err)
		}
		if last.fds <= base.fds || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last.fds > base.fds {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		var targets []string
		for _, e := range fds {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
			targets = append(targets, e.Name()+"->"+l)
		}
		t.Errorf("after the workload closed every file the server still has %d fds open (idle: %d): %s", last.fds, base.fds, strings.Join(targets, " "))
	}
	limit := 2*warmRSS + 32<<20
	for _, s := range samples {
		if s.at >= warm && s.rss > limit {
			t.Errorf("at %v the server's rss is %d KiB, over 2x its %d KiB after the warm-up + 32 MiB", s.at.Round(time.Second), s.rss>>10, warmRSS>>10)
			break
		}
	}
	if last.rss > limit {
		t.Errorf("after the workload the server's rss is %d KiB, over 2x its %d KiB after the warm-up + 32 MiB", last.rss>>10, warmRSS>>10)
	}
	// The sandbox is still consistent: status reads it.
	r := sbxfsCLI(t, cliTimeout, "status", sb.mnt)
	if r.code != 0 {
		t.Errorf("status after the soak: %s", r)
	}
}
