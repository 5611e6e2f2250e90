package tests

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSparseFilesAndSeek: a sparse file past 4 GiB, SEEK_DATA/SEEK_HOLE,
// sparse copy-up, fallocate.
func TestSparseFilesAndSeek(t *testing.T) {
	orig := newOrig(t, map[string]string{"dense.txt": "dense"})
	const far = 5 << 30
	sp, err := os.Create(filepath.Join(orig, "sparse-orig"))
	require.NoError(t, err)
	_, err = sp.WriteAt([]byte{'Z'}, far)
	require.NoError(t, err)
	require.NoError(t, sp.Close())
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)

	t.Run("write past 4GiB", func(t *testing.T) {
		fd, err := unix.Open(sb.path("sparse"), unix.O_RDWR|unix.O_CREAT, 0o644)
		require.NoError(t, err)
		defer unix.Close(fd)
		_, err = unix.Pwrite(fd, []byte{'X'}, far)
		require.NoError(t, err)
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd, &st))
		assert.Equal(t, int64(far+1), st.Size)
		assert.Less(t, st.Blocks, int64(1024), "a 1-byte write at 5 GiB allocated %d blocks", st.Blocks)
		b := make([]byte, 1)
		_, err = unix.Pread(fd, b, far)
		require.NoError(t, err)
		assert.Equal(t, "X", string(b))
		off, err := unix.Seek(fd, 0, unix.SEEK_DATA)
		require.NoError(t, err)
		assert.Equal(t, int64(far), off, "SEEK_DATA from 0")
		off, err = unix.Seek(fd, 0, unix.SEEK_HOLE)
		require.NoError(t, err)
		assert.Equal(t, int64(0), off, "SEEK_HOLE from 0")
		off, err = unix.Seek(fd, far, unix.SEEK_HOLE)
		require.NoError(t, err)
		assert.Equal(t, int64(far+1), off, "SEEK_HOLE from the data")
		_, err = unix.Seek(fd, far+1, unix.SEEK_DATA)
		assert.ErrorIs(t, err, unix.ENXIO, "SEEK_DATA at EOF")
	})
	t.Run("original sparse file", func(t *testing.T) {
		fd, err := unix.Open(sb.path("sparse-orig"), unix.O_RDONLY, 0)
		require.NoError(t, err)
		off, err := unix.Seek(fd, 0, unix.SEEK_DATA)
		unix.Close(fd)
		require.NoError(t, err)
		assert.Equal(t, int64(far), off, "SEEK_DATA on an original (lower) file")
		// Copy-up keeps it sparse.
		wfd, err := unix.Open(sb.path("sparse-orig"), unix.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = unix.Pwrite(wfd, []byte{'A'}, 0)
		require.NoError(t, err)
		require.NoError(t, unix.Close(wfd))
		ust := lstat(t, sb.upperPath("sparse-orig"))
		assert.Equal(t, int64(far+1), ust.Size)
		assert.Less(t, ust.Blocks, int64(1024), "copy-up of a sparse file allocated %d blocks", ust.Blocks)
		fd, err = unix.Open(sb.path("sparse-orig"), unix.O_RDONLY, 0)
		require.NoError(t, err)
		defer unix.Close(fd)
		off, err = unix.Seek(fd, 0, unix.SEEK_HOLE)
		require.NoError(t, err)
		assert.Less(t, off, int64(far), "SEEK_HOLE after the sparse copy-up")
		b := make([]byte, 1)
		_, err = unix.Pread(fd, b, far)
		require.NoError(t, err)
		assert.Equal(t, "Z", string(b))
	})
	t.Run("fallocate", func(t *testing.T) {
		fd, err := unix.Open(sb.path("falloc"), unix.O_RDWR|unix.O_CREAT, 0o644)
		require.NoError(t, err)
		defer unix.Close(fd)
		require.NoError(t, unix.Fallocate(fd, 0, 0, 1<<20))
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd, &st))
		assert.Equal(t, int64(1<<20), st.Size)
		assert.GreaterOrEqual(t, st.Blocks, int64(2048))
		require.NoError(t, unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 1<<20, 1<<20))
		require.NoError(t, unix.Fstat(fd, &st))
		assert.Equal(t, int64(1<<20), st.Size, "FALLOC_FL_KEEP_SIZE changed the size")
		assert.GreaterOrEqual(t, st.Blocks, int64(4096))
		_, err = unix.Pwrite(fd, bytes.Repeat([]byte{1}, 4096), 0)
		require.NoError(t, err)
		require.NoError(t, unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096))
		b := make([]byte, 4096)
		_, err = unix.Pread(fd, b, 0)
		require.NoError(t, err)
		assert.Equal(t, make([]byte, 4096), b, "punched range reads as zeros")
		// On an original file: copy-up first, the original keeps its size.
		ofd, err := unix.Open(sb.path("dense.txt"), unix.O_RDWR, 0)
		require.NoError(t, err)
		defer unix.Close(ofd)
		require.NoError(t, unix.Fallocate(ofd, 0, 0, 8192))
		require.NoError(t, unix.Fstat(ofd, &st))
		assert.Equal(t, int64(8192), st.Size)
	})
}

// TestLocks: flock and fcntl locks between two processes.
func TestLocks(t *testing.T) {
	orig := newOrig(t, map[string]string{"orig-lock": "x"})
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	for _, name := range []string{"lockme", "orig-lock"} {
		p := sb.path(name)
		t.Run("flock "+name, func(t *testing.T) {
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
			require.NoError(t, err)
			defer unix.Close(fd)
			require.NoError(t, unix.Flock(fd, unix.LOCK_EX))
			out, err := runTimeout(10*time.Second, "flock", "-n", "-E", "42", p, "true")
			assert.Equal(t, 42, exitCode(err), "flock -n on a locked file: %v %s", err, out)
			require.NoError(t, unix.Flock(fd, unix.LOCK_UN))
			out, err = runTimeout(10*time.Second, "flock", "-n", "-E", "42", p, "true")
			assert.NoError(t, err, "flock -n on an unlocked file: %s", out)
		})
		t.Run("fcntl "+name, func(t *testing.T) {
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
			require.NoError(t, err)
			defer unix.Close(fd)
			lk := unix.Flock_t{Type: unix.F_WRLCK}
			require.NoError(t, unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk))
			out, err := helperCmd(t, "fcntl-trylock", p).CombinedOutput()
			assert.Equal(t, 3, exitCode(err), "F_SETLK from another process on a locked file: %v %s", err, out)
			out, err = helperCmd(t, "fcntl-getlk", p).Output()
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprintf("%d %d", unix.F_WRLCK, os.Getpid()), strings.TrimSpace(string(out)), "F_GETLK from another process")
			lk.Type = unix.F_UNLCK
			require.NoError(t, unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk))
			out, err = helperCmd(t, "fcntl-trylock", p).CombinedOutput()
			assert.NoError(t, err, "F_SETLK from another process on an unlocked file: %s", out)
		})
	}
}

func exitCode(err error) int {
	var ee interface{ ExitCode() int }
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestFileOps: statfs, fsync, open files that are unlinked or renamed,
// FIFOs and sockets, O_APPEND, O_EXCL, ENOTEMPTY.
func TestFileOps(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"orig-unlink.txt": "orig",
		"orig-rename.txt": "orig",
		"orig-append.txt": "orig",
		"orig-excl.txt":   "orig",
		"orig-sync.txt":   "orig",
		"orig-ro.txt":     "orig",
		"orig-emptydir/":  "",
		"full/a":          "a",
		"full/sub/b":      "b",
		"full2/a":         "a",
		"full3/a":         "a",
	})
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)

	t.Run("statfs", func(t *testing.T) {
		var st, ust unix.Statfs_t
		require.NoError(t, unix.Statfs(sb.mnt, &st))
		require.NoError(t, unix.Statfs(sb.upper, &ust))
		assert.Equal(t, int64(0x65735546), st.Type, "f_type is FUSE's")
		assert.Positive(t, st.Blocks)
		assert.Positive(t, st.Bsize)
		assert.Equal(t, ust.Blocks*uint64(ust.Bsize), st.Blocks*uint64(st.Bsize), "size of the upper's filesystem")
	})
	t.Run("fsync", func(t *testing.T) {
		for _, name := range []string{"new-sync.txt", "orig-sync.txt"} {
			fd, err := unix.Open(sb.path(name), unix.O_RDWR|unix.O_CREAT, 0o644)
			require.NoError(t, err)
			_, err = unix.Write(fd, []byte("synced"))
			require.NoError(t, err)
			assert.NoError(t, unix.Fsync(fd), "fsync %s", name)
			assert.NoError(t, unix.Fdatasync(fd), "fdatasync %s", name)
			require.NoError(t, unix.Close(fd))
		}
		fd, err := unix.Open(sb.path("orig-unlink.txt"), unix.O_RDONLY, 0)
		require.NoError(t, err)
		assert.NoError(t, unix.Fsync(fd), "fsync of a read-only original file")
		unix.Close(fd)
		dfd, err := unix.Open(sb.path("full"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		require.NoError(t, err)
		assert.NoError(t, unix.Fsync(dfd), "fsync of a directory")
		assert.NoError(t, unix.Syncfs(dfd), "syncfs")
		unix.Close(dfd)
	})
	t.Run("unlink open file", func(t *testing.T) {
		for _, name := range []string{"new-unlink.txt", "orig-unlink.txt"} {
			fd, err := unix.Open(sb.path(name), unix.O_RDWR|unix.O_CREAT, 0o644)
			require.NoError(t, err)
			_, err = unix.Pwrite(fd, []byte("abc"), 0)
			require.NoError(t, err)
			require.NoError(t, os.Remove(sb.path(name)))
			_, err = os.Lstat(sb.path(name))
			assert.True(t, errors.Is(err, os.ErrNotExist), "%s: unlinked name still there: %v", name, err)
			_, err = unix.Pwrite(fd, []byte("def"), 3)
			assert.NoError(t, err, "%s: write after unlink", name)
			assert.Equal(t, "abcdef", preadAll(t, fd), "%s: read after unlink", name)
			var st unix.Stat_t
			assert.NoError(t, unix.Fstat(fd, &st), "%s: fstat after unlink", name)
			assert.Equal(t, uint64(0), st.Nlink, "%s: nlink after unlink", name)
			assert.NoError(t, unix.Ftruncate(fd, 2), "%s: ftruncate after unlink", name)
			assert.Equal(t, "ab", preadAll(t, fd), "%s: read after ftruncate", name)
			// The kernel sends no file handle with these: the server must
			// find the open file itself.
			assert.NoError(t, unix.Fchmod(fd, 0o600), "%s: fchmod after unlink", name)
			assert.NoError(t, unix.Fchown(fd, 0, 0), "%s: fchown after unlink", name)
			assert.NoError(t, unix.Futimes(fd, []unix.Timeval{{Sec: 1}, {Sec: 2}}), "%s: futimes after unlink", name)
			assert.NoError(t, unix.Fsetxattr(fd, "user.k", []byte("v"), 0), "%s: fsetxattr after unlink", name)
			require.NoError(t, unix.Close(fd))
		}
		assert.True(t, isWhiteout(t, sb.upperPath("orig-unlink.txt")), "whiteout of the unlinked original")
	})
	t.Run("unlink file open read-only", func(t *testing.T) {
		// A reader keeps an original file open (tail -f, a pager) while it
		// is deleted: fstat and reads keep working, as on a plain filesystem.
		fd, err := unix.Open(sb.path("orig-ro.txt"), unix.O_RDONLY, 0)
		require.NoError(t, err)
		defer unix.Close(fd)
		require.NoError(t, os.Remove(sb.path("orig-ro.txt")))
		var st unix.Stat_t
		if assert.NoError(t, unix.Fstat(fd, &st), "fstat of a deleted original file open read-only") {
			assert.Equal(t, uint64(0), st.Nlink)
			assert.Equal(t, int64(4), st.Size)
		}
		assert.Equal(t, "orig", preadAll(t, fd), "read of a deleted original file open read-only")
		assert.NoError(t, unix.Fchmod(fd, 0o600), "fchmod of a deleted original file open read-only")
		assert.NoError(t, unix.Futimes(fd, []unix.Timeval{{Sec: 1}, {Sec: 2}}), "futimes of a deleted original file open read-only")
	})
	t.Run("rmdir open directory", func(t *testing.T) {
		for _, name := range []string{"orig-emptydir", "new-emptydir"} {
			if name == "new-emptydir" {
				require.NoError(t, os.Mkdir(sb.path(name), 0o755))
			}
			fd, err := unix.Open(sb.path(name), unix.O_RDONLY|unix.O_DIRECTORY, 0)
			require.NoError(t, err)
			require.NoError(t, unix.Rmdir(sb.path(name)))
			var st unix.Stat_t
			assert.NoError(t, unix.Fstat(fd, &st), "%s: fstat of an open directory after rmdir", name)
			unix.Close(fd)
		}
	})
	t.Run("rename open file", func(t *testing.T) {
		for _, name := range []string{"new-rename.txt", "orig-rename.txt"} {
			fd, err := unix.Open(sb.path(name), unix.O_RDWR|unix.O_CREAT, 0o644)
			require.NoError(t, err)
			_, err = unix.Pwrite(fd, []byte("1234"), 0)
			require.NoError(t, err)
			require.NoError(t, os.Rename(sb.path(name), sb.path(name+".moved")))
			_, err = unix.Pwrite(fd, []byte("56"), 4)
			assert.NoError(t, err, "%s: write after rename", name)
			assert.Equal(t, "123456", preadAll(t, fd), "%s: read after rename", name)
			require.NoError(t, unix.Close(fd))
			assert.Equal(t, "123456", mustRead(t, sb.path(name+".moved")))
		}
	})
	t.Run("fifo", func(t *testing.T) {
		p := sb.path("fifo")
		require.NoError(t, unix.Mkfifo(p, 0o600))
		assert.Equal(t, uint32(unix.S_IFIFO), lstat(t, p).Mode&unix.S_IFMT)
		assert.Equal(t, uint32(unix.S_IFIFO), lstat(t, sb.upperPath("fifo")).Mode&unix.S_IFMT, "fifo in the upper")
		done := make(chan error, 1)
		go func() {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err == nil {
				_, err = f.Write([]byte("ping"))
				f.Close()
			}
			done <- err
		}()
		f, err := os.Open(p)
		require.NoError(t, err)
		b := make([]byte, 4)
		_, err = f.Read(b)
		f.Close()
		require.NoError(t, err)
		require.NoError(t, <-done)
		assert.Equal(t, "ping", string(b))
	})
	t.Run("unix socket", func(t *testing.T) {
		p := sb.path("sock")
		l, err := listenUnix(p)
		require.NoError(t, err)
		defer l.Close()
		assert.Equal(t, uint32(unix.S_IFSOCK), lstat(t, p).Mode&unix.S_IFMT)
		assert.Equal(t, uint32(unix.S_IFSOCK), lstat(t, sb.upperPath("sock")).Mode&unix.S_IFMT, "socket in the upper")
		go func() {
			c, err := l.Accept()
			if err == nil {
				b := make([]byte, 4)
				n, _ := c.Read(b)
				_, _ = c.Write(b[:n])
				c.Close()
			}
		}()
		got, err := echoUnix(p, "echo")
		require.NoError(t, err)
		assert.Equal(t, "echo", got)
	})
	t.Run("O_APPEND", func(t *testing.T) {
		fa, err := os.OpenFile(sb.path("appended"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		require.NoError(t, err)
		fb, err := os.OpenFile(sb.path("appended"), os.O_WRONLY|os.O_APPEND, 0)
		require.NoError(t, err)
		for _, w := range []struct {
			f *os.File
			s string
		}{{fa, "a1"}, {fb, "b1"}, {fa, "a2"}, {fb, "b2"}} {
			_, err := w.f.Write([]byte(w.s))
			require.NoError(t, err)
		}
		fa.Close()
		fb.Close()
		assert.Equal(t, "a1b1a2b2", mustRead(t, sb.path("appended")))
		require.NoError(t, appendFile(sb.path("orig-append.txt"), []byte("+tail")))
		assert.Equal(t, "orig+tail", mustRead(t, sb.path("orig-append.txt")))
	})
	t.Run("O_EXCL", func(t *testing.T) {
		excl := func(rel string) error {
			fd, err := unix.Open(sb.path(rel), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
			if err == nil {
				_, err = unix.Write(fd, []byte("excl"))
				unix.Close(fd)
			}
			return err
		}
		assert.ErrorIs(t, excl("orig-excl.txt"), unix.EEXIST, "O_EXCL on an original file")
		require.NoError(t, excl("new-excl.txt"))
		assert.ErrorIs(t, excl("new-excl.txt"), unix.EEXIST, "O_EXCL on a created file")
		require.NoError(t, os.Remove(sb.path("orig-excl.txt")))
		assert.NoError(t, excl("orig-excl.txt"), "O_EXCL over a whiteout")
		assert.Equal(t, "excl", mustRead(t, sb.path("orig-excl.txt")))
	})
	t.Run("ENOTEMPTY", func(t *testing.T) {
		assert.ErrorIs(t, unix.Rmdir(sb.path("full")), unix.ENOTEMPTY, "rmdir of a directory with only original entries")
		assert.ErrorIs(t, unix.Rmdir(sb.path("full/sub")), unix.ENOTEMPTY)
		require.NoError(t, os.Remove(sb.path("full/sub/b")))
		require.NoError(t, os.Remove(sb.path("full/sub")))
		require.NoError(t, os.Remove(sb.path("full/a")))
		assert.NoError(t, unix.Rmdir(sb.path("full")), "rmdir once the original entries are deleted")
		require.NoError(t, os.Remove(sb.path("full2/a")))
		require.NoError(t, os.WriteFile(sb.path("full2/new"), nil, 0o644))
		assert.ErrorIs(t, unix.Rmdir(sb.path("full2")), unix.ENOTEMPTY, "rmdir with a new entry")
		require.NoError(t, os.Mkdir(sb.path("emptynew"), 0o755))
		assert.ErrorIs(t, unix.Renameat2(unix.AT_FDCWD, sb.path("emptynew"), unix.AT_FDCWD, sb.path("full3"), 0), unix.ENOTEMPTY,
			"rename over a directory with only original entries")
	})
}

func listenUnix(p string) (net.Listener, error) { return net.Listen("unix", p) }

func echoUnix(p, msg string) (string, error) {
	c, err := net.DialTimeout("unix", p, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	b := make([]byte, len(msg))
	n, err := c.Read(b)
	return string(b[:n]), err
}

// TestLargeReadsOfOriginalFiles: an original file read through the mount
// in large requests (1 MiB reads, readahead) comes back whole and right,
// through splice: the server logs nothing (a request too large for a
// pipe used to fail to splice and log a line for every MiB read).
func TestLargeReadsOfOriginalFiles(t *testing.T) {
	data := make([]byte, 24<<20+12345)
	rand.New(rand.NewSource(1)).Read(data)
	orig := newOrig(t, map[string]string{"big": string(data)})
	sb := mountSandbox(t, orig)
	before := len(sb.log.String())
	f, err := os.Open(sb.path("big"))
	require.NoError(t, err)
	defer f.Close()
	got := make([]byte, 0, len(data))
	buf := make([]byte, 4<<20)
	for {
		n, err := f.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	require.True(t, bytes.Equal(data, got), "the content read through the mount differs (%d bytes read, want %d)", len(got), len(data))
	assert.Empty(t, strings.TrimSpace(sb.log.String()[before:]), "the server logged while serving reads")
}
