package fsutiltest

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// DeepRel returns a relative path of depth directories, each named name
// repeated to 200 bytes with its depth, so that 21 of them pass PATH_MAX.
func DeepRel(name string, depth int) string {
	c := strings.Repeat(name, 200/len(name)+1)[:200]
	parts := make([]string, depth)
	for i := range parts {
		parts[i] = c
	}
	return strings.Join(parts, "/")
}

// OpenDeep opens rel beneath root one component at a time (openat from the
// directory before, O_NOFOLLOW), which no PATH_MAX limits, and returns the
// descriptor of its last component opened with flags (closed when the test
// ends). With mkdir, missing directories on the way are made (0755).
func OpenDeep(t testing.TB, root, rel string, flags int, mkdir bool) int {
	t.Helper()
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", root, err)
	}
	parts := strings.Split(rel, "/")
	for i, c := range parts {
		last := i == len(parts)-1
		if mkdir && !last {
			if err := unix.Mkdirat(dir, c, 0o755); err != nil && err != unix.EEXIST {
				t.Fatalf("mkdir %s at depth %d: %v", c[:8], i, err)
			}
		}
		fl := unix.O_PATH | unix.O_DIRECTORY
		if last {
			fl = flags
		}
		fd, err := unix.Openat(dir, c, fl|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		unix.Close(dir)
		if err != nil {
			t.Fatalf("open %s at depth %d: %v", c[:min(8, len(c))], i, err)
		}
		dir = fd
	}
	t.Cleanup(func() { unix.Close(dir) })
	return dir
}

// WriteDeep writes data to a new file rel beneath root, making its
// directories (OpenDeep).
func WriteDeep(t testing.TB, root, rel, data string) {
	t.Helper()
	fd := OpenDeep(t, root, rel, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, true)
	if _, err := unix.Write(fd, []byte(data)); err != nil {
		t.Fatalf("write %s: %v", rel[len(rel)-20:], err)
	}
}

// ReadDeep reads the file rel beneath root (OpenDeep).
func ReadDeep(t testing.TB, root, rel string) string {
	t.Helper()
	fd := OpenDeep(t, root, rel, unix.O_RDONLY, false)
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil {
			t.Fatalf("read %s: %v", rel[len(rel)-20:], err)
		}
		if n == 0 {
			return b.String()
		}
		b.Write(buf[:n])
	}
}
