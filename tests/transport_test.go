package tests

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// enableURing is the fuse module's switch for FUSE over io_uring (Linux
// 6.14+, off by default).
const enableURing = "/sys/module/fuse/parameters/enable_uring"

// setURing turns the kernel's FUSE over io_uring on or off for the mounts
// the test makes, and back as it was afterwards.
func setURing(t *testing.T, on bool) {
	t.Helper()
	old, err := os.ReadFile(enableURing)
	if err != nil {
		t.Skipf("this kernel has no FUSE over io_uring: %v", err)
	}
	val := "N"
	if on {
		val = "Y"
	}
	require.NoError(t, os.WriteFile(enableURing, []byte(val), 0))
	t.Cleanup(func() { _ = os.WriteFile(enableURing, bytes.TrimSpace(old), 0) })
}

// TestIOUringTransport: where the kernel offers io_uring, the server takes
// its requests through it (one ring queue a CPU), and every kind of request
// gives the answer it gives through /dev/fuse: names, data in both
// directions (1 MiB writes and reads, passthrough off so that they reach
// the server), xattrs, links, renames, listings. --no-io-uring keeps the
// server on /dev/fuse; so does the kernel's switch turned off.
func TestIOUringTransport(t *testing.T) {
	cases := []struct {
		name      string
		on        bool
		opts      []mountOption
		transport string
	}{
		{"io_uring", true, []mountOption{withNoPassthrough()}, "io_uring"},
		{"io_uring-passthrough", true, nil, "io_uring"},
		{"no-io-uring flag", true, []mountOption{withNoPassthrough(), withNoIOUring()}, "/dev/fuse"},
		{"kernel switch off", false, []mountOption{withNoPassthrough()}, "/dev/fuse"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			setURing(t, c.on)
			results, served := transportWorkload(t, c.opts...)
			assert.Equal(t, "transport="+c.transport, results["transport"])
			delete(results, "transport")
			if c.transport == "io_uring" {
				// Every request of the workload but FORGETs and the
				// few before the queues were registered.
				assert.Greater(t, served, 100, "requests answered through io_uring")
			} else {
				assert.Zero(t, served, "requests answered through io_uring")
			}
			want := map[string]string{
				"big":       strconv.Itoa(3<<20 + 1),
				"copy":      "same",
				"names":     "a c d l new s",
				"readlink":  "a/b",
				"hardlinks": "2",
				"xattr":     strings.Repeat("v", 3000),
				"xattrs":    "user.k",
				"sub":       "40",
				"gone":      "no such file or directory",
				"truncated": "4",
			}
			assert.Equal(t, want, results)
		})
	}
}

// transportWorkload mounts a sandbox, runs one of every kind of request
// through it, unmounts it, and returns what each step saw, the transport
// the server reported and how many requests it answered through io_uring.
func transportWorkload(t *testing.T, opts ...mountOption) (map[string]string, int) {
	t.Helper()
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16)
	orig := newOrig(t, map[string]string{"a/b": "hello", "c": "see"})
	require.NoError(t, os.WriteFile(filepath.Join(orig, "big"), big, 0o644))
	sb := mountSandbox(t, orig, opts...)
	got := map[string]string{}
	if m := regexp.MustCompile(`transport=(\S+)`).FindString(sb.log.String()); m != "" {
		got["transport"] = m
	}

	// Large writes and reads: the original's 3 MiB read back, appended
	// to, copied to a new file, compared.
	f, err := os.OpenFile(sb.path("big"), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte("!"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	data, err := os.ReadFile(sb.path("big"))
	require.NoError(t, err)
	got["big"] = strconv.Itoa(len(data))
	require.NoError(t, os.WriteFile(sb.path("d"), data, 0o644))
	if back, err := os.ReadFile(sb.path("d")); err == nil && bytes.Equal(back, append(big, '!')) {
		got["copy"] = "same"
	}

	// Names: create, rename, symlink, hard link, unlink, mkdir, listing.
	require.NoError(t, os.WriteFile(sb.path("tmp"), []byte("x"), 0o600))
	require.NoError(t, os.Rename(sb.path("tmp"), sb.path("new")))
	require.NoError(t, os.Symlink("a/b", sb.path("s")))
	require.NoError(t, os.Link(sb.path("c"), sb.path("l")))
	require.NoError(t, os.Mkdir(sb.path("sub"), 0o755))
	for i := range 40 {
		require.NoError(t, os.WriteFile(sb.path("sub", "f"+strconv.Itoa(i)), []byte("y"), 0o644))
	}
	entries, err := os.ReadDir(sb.mnt)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		if e.Name() != "big" && e.Name() != "sub" {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	got["names"] = strings.Join(names, " ")
	if l, err := os.Readlink(sb.path("s")); err == nil {
		got["readlink"] = l
	}
	got["hardlinks"] = strconv.Itoa(int(lstat(t, sb.path("l")).Nlink))
	sub, err := os.ReadDir(sb.path("sub"))
	require.NoError(t, err)
	got["sub"] = strconv.Itoa(len(sub))

	// Xattrs: a value larger than a page, listed and read back.
	require.NoError(t, unix.Setxattr(sb.path("c"), "user.k", []byte(strings.Repeat("v", 3000)), 0))
	buf := make([]byte, 8192)
	if n, err := unix.Getxattr(sb.path("c"), "user.k", buf); err == nil {
		got["xattr"] = string(buf[:n])
	}
	if n, err := unix.Listxattr(sb.path("c"), buf); err == nil {
		got["xattrs"] = strings.TrimRight(string(buf[:n]), "\x00")
	}

	// Removal and size changes.
	require.NoError(t, os.Remove(sb.path("a", "b")))
	if _, err := os.Stat(sb.path("a", "b")); err != nil {
		got["gone"] = strings.TrimPrefix(err.Error(), "stat "+sb.path("a", "b")+": ")
	}
	require.NoError(t, os.Truncate(sb.path("new"), 4))
	if st, err := os.Stat(sb.path("new")); err == nil {
		got["truncated"] = strconv.Itoa(int(st.Size()))
	}

	require.NoError(t, sb.stop())
	served := -1
	if m := regexp.MustCompile(`io_uring_requests=(\d+)`).FindStringSubmatch(sb.log.String()); m != nil {
		served, _ = strconv.Atoi(m[1])
	}
	return got, served
}

// TestIOUringFallsBack: when the server cannot use the rings it negotiated
// (a ring it cannot make, a registration the kernel refuses, no ring at
// all), the mount still works, through /dev/fuse, and unmounts cleanly.
// The faults are made on purpose (SBXFS_URING_FAULT, fuse/uring_serve.go).
func TestIOUringFallsBack(t *testing.T) {
	for _, fault := range []string{"setup", "register", "all"} {
		t.Run(fault, func(t *testing.T) {
			setURing(t, true)
			results, served := transportWorkload(t, withNoPassthrough(), allowServerErrors(),
				withServerEnv("SBXFS_URING_FAULT="+fault))
			assert.Equal(t, "transport=/dev/fuse", results["transport"])
			assert.Equal(t, "same", results["copy"])
			assert.Equal(t, "a c d l new s", results["names"])
			assert.Zero(t, served, "requests answered through io_uring")
		})
	}
}

// TestIOUringGivesBackBuffers: the payload buffer of a ring entry that
// answered a large READ holds that much memory resident; the server gives
// it back once the entry has been idle a few seconds (fuse/uring_pool.go,
// trim), so a process serving many mounts does not keep megabytes per
// mount and CPU after a read.
func TestIOUringGivesBackBuffers(t *testing.T) {
	setURing(t, true)
	orig := newOrig(t, nil)
	ncpu := runtime.NumCPU()
	for c := range ncpu {
		require.NoError(t, os.WriteFile(filepath.Join(orig, "big"+strconv.Itoa(c)), bytes.Repeat([]byte{byte(c + 1)}, 16<<20), 0o644))
	}
	sb := mountSandbox(t, orig)
	require.Contains(t, sb.log.String(), "transport=io_uring")
	cmd, _ := sb.running()
	require.NotNil(t, cmd)
	pid := cmd.Process.Pid
	_, err := os.Stat(sb.path("big0"))
	require.NoError(t, err)
	before := rssAnonKB(t, pid)

	// Each file read from its own CPU: the kernel's readahead sends
	// READs of up to 1 MiB to the queue of the CPU the reader runs on.
	for c := range ncpu {
		readOnCPU(t, c, sb.path("big"+strconv.Itoa(c)))
	}
	after := rssAnonKB(t, pid)
	t.Logf("server RssAnon: %d KiB before the reads, %d KiB after", before, after)
	require.Greater(t, after-before, int64(1024), "large READs answered through the rings leave their buffers resident")

	// Given back: at least three quarters of what the reads took (the
	// Go heap may have grown a little meanwhile).
	var last int64
	assert.Eventually(t, func() bool {
		last = rssAnonKB(t, pid)
		return last-before < (after-before)/4
	}, 20*time.Second, 250*time.Millisecond, "the entries' buffers are given back once idle")
	t.Logf("server RssAnon after the entries were idle: %d KiB", last)
}

// readOnCPU reads the file at p to the end from a thread pinned to cpu.
func readOnCPU(t *testing.T, cpu int, p string) {
	t.Helper()
	done := make(chan error)
	go func() {
		// The thread is put back as it was, not ended: the server may
		// have been started from it, and its parent-death signal
		// (Pdeathsig) follows the thread, not the process.
		runtime.LockOSThread()
		var old unix.CPUSet
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer func() {
			if unix.SchedSetaffinity(0, &old) == nil {
				runtime.UnlockOSThread()
			}
		}()
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			done <- err
			return
		}
		b, err := os.ReadFile(p)
		if err == nil && len(b) == 0 {
			err = errors.New("empty")
		}
		done <- err
	}()
	require.NoError(t, <-done, "read %s on CPU %d", p, cpu)
}

// rssAnonKB is the resident anonymous memory of process pid, in KiB.
func rssAnonKB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssAnon:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb
		}
	}
	t.Fatalf("no RssAnon in /proc/%d/status", pid)
	return 0
}
