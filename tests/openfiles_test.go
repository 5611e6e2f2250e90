package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A reader opened on an original file, a writer opened after it (the file
// is copied up), the name unlinked or replaced, then a write: the reader
// sees the one file the writer changed, as on ext4 (seed 166 of the
// differential commit test: the reader kept the original's size).
func TestReaderSeesWritesAfterUnlink(t *testing.T) {
	for _, how := range []string{"unlink", "rename-over"} {
		t.Run(how, func(t *testing.T) {
			orig := newOrig(t, map[string]string{"f": "0123456789", "other": "x"})
			sb := mountSandbox(t, orig)
			r, err := os.Open(sb.path("f"))
			require.NoError(t, err)
			defer r.Close()
			w, err := os.OpenFile(sb.path("f"), os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			defer w.Close()
			if how == "unlink" {
				require.NoError(t, os.Remove(sb.path("f")))
			} else {
				require.NoError(t, os.Rename(sb.path("other"), sb.path("f")))
			}
			_, err = w.Write([]byte("abc"))
			require.NoError(t, err)
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(int(r.Fd()), &st))
			assert.Equal(t, int64(13), st.Size, "fstat of the reader")
			b := make([]byte, 32)
			n, err := unix.Pread(int(r.Fd()), b, 0)
			require.NoError(t, err)
			assert.Equal(t, "0123456789abc", string(b[:n]), "read through the reader")
		})
	}
}

// The root of a mount has a real inode number, stable across remounts
// (go-fuse alone reports 0), and the mount reads ahead 1 MiB.
func TestRootInodeAndReadahead(t *testing.T) {
	sb := mountSandbox(t, newOrig(t, map[string]string{"f": "x"}))
	var st unix.Stat_t
	require.NoError(t, unix.Stat(sb.mnt, &st))
	assert.NotZero(t, st.Ino, "the root's inode number")
	ino := st.Ino
	remount(t, sb)
	require.NoError(t, unix.Stat(sb.mnt, &st))
	assert.Equal(t, ino, st.Ino, "the same after a remount")
	if os.Geteuid() == 0 {
		b, err := os.ReadFile(fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)))
		require.NoError(t, err)
		assert.Equal(t, "1024", strings.TrimSpace(string(b)))
	}
}

// An unprivileged server copies a writable file up out of an original
// directory its owner cannot write (0555): as on ext4, the file can be
// written; the directory stays 0555 and creating in it is still refused.
func TestUnprivilegedCopyUpInReadOnlyDir(t *testing.T) {
	orig := newOrig(t, map[string]string{"ro/f": "data", "ro/sub/g": "g"})
	sb := mountSandbox(t, orig, asNobody())
	for _, d := range []string{"ro/sub", "ro"} {
		require.NoError(t, os.Chmod(filepath.Join(orig, d), 0o555))
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(orig, "ro"), 0o755) })
	script := `set -e
cd "$1"
echo more >> ro/f
echo more >> ro/sub/g
chmod 0600 ro/f
if touch ro/new 2>/dev/null; then echo "created in a 0555 directory"; exit 1; fi
stat -c %a ro ro/sub
`
	out, err := nobodyCmd(t, "sh", "-c", script, "sh", sb.mnt).CombinedOutput()
	require.NoError(t, err, "as nobody: %s", out)
	assert.Equal(t, "555\n555\n", string(out))
	assert.Equal(t, "datamore\n", mustRead(t, sb.upperPath("ro/f")))
	assert.Equal(t, "gmore\n", mustRead(t, sb.upperPath("ro/sub/g")))
	assert.Equal(t, uint32(0o555), lstat(t, sb.upperPath("ro")).Mode&0o7777, "the upper copy keeps the mode")
}

// A FIFO open for reading, its mode changed through the descriptor, then
// its name removed: fstat shows the new mode, as on ext4 (seed 456 of the
// differential commit test showed the mode from before the fchmod).
func TestFchmodThenUnlinkOpenFIFO(t *testing.T) {
	orig := newOrig(t, map[string]string{"keep": "k"})
	sb := mountSandbox(t, orig)
	require.NoError(t, unix.Mkfifo(sb.path("p"), 0o644))
	fd, err := unix.Open(sb.path("p"), unix.O_RDONLY|unix.O_NONBLOCK, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Fchmod(fd, 0o444))
	require.NoError(t, os.Rename(sb.path("p"), sb.path("q")))
	require.NoError(t, os.Remove(sb.path("q")))
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	assert.Equal(t, uint32(unix.S_IFIFO|0o444), st.Mode)
	assert.Equal(t, uint64(0), uint64(st.Nlink))
}

// Objects removed while open that the server holds no handle of (a FIFO,
// a directory) still take fchmod, fchown and futimens through their
// descriptors, as on ext4, and fstat shows the change (seed 151326162 of
// the differential test: fchmod of an unlinked FIFO failed with ENOENT)
// and, for a directory, size 0 as ext4 (seed 437312202: an mmap of the
// removed directory was tried where ext4 showed nothing to map); but a
// directory a rename replaced keeps its size, as on ext4 (seed 205 of
// TestDifferentialLostJournalTail: the mmap answered ok where ext4 found
// something to map and refused it).
func TestChangeRemovedWhileOpen(t *testing.T) {
	orig := newOrig(t, map[string]string{"keep": "k"})
	sb := mountSandbox(t, orig)
	plain := t.TempDir()
	for _, kind := range []string{"fifo", "dir", "replaced-dir"} {
		t.Run(kind, func(t *testing.T) {
			run := func(dir string) unix.Stat_t {
				p := filepath.Join(dir, kind)
				var fd int
				var err error
				if kind == "fifo" {
					require.NoError(t, unix.Mkfifo(p, 0o640))
					fd, err = unix.Open(p, unix.O_RDWR, 0)
				} else {
					require.NoError(t, unix.Mkdir(p, 0o750))
					fd, err = unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
				}
				require.NoError(t, err)
				t.Cleanup(func() { unix.Close(fd) })
				before := lstat(t, p)
				switch kind {
				case "fifo":
					require.NoError(t, unix.Unlink(p))
				case "dir":
					require.NoError(t, unix.Rmdir(p))
				default:
					require.NoError(t, unix.Mkdir(p+".new", 0o700))
					require.NoError(t, unix.Rename(p+".new", p))
				}
				// The removal made the kernel forget the attributes:
				// this fstat asks the server, which answers with the
				// ones it kept of the object.
				var removed unix.Stat_t
				require.NoError(t, unix.Fstat(fd, &removed))
				assert.Equal(t, before.Mode, removed.Mode, "%s: mode once removed", dir)
				assert.Equal(t, []uint32{before.Uid, before.Gid}, []uint32{removed.Uid, removed.Gid}, "%s: owner once removed", dir)
				assert.Equal(t, before.Mtim, removed.Mtim, "%s: mtime once removed", dir)
				assert.Equal(t, before.Atim, removed.Atim, "%s: atime once removed", dir)
				assert.Zero(t, removed.Nlink, "%s: no link left", dir)
				require.NoError(t, unix.Fchmod(fd, 0o4711), "fchmod after the removal")
				require.NoError(t, unix.Fchown(fd, 1000, 1001), "fchown after the removal")
				ts := []unix.Timespec{{Sec: 1_000_000_000, Nsec: 7}, {Sec: 1_100_000_000, Nsec: 9}}
				require.NoError(t, unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH), "futimens after the removal")
				var st unix.Stat_t
				require.NoError(t, unix.Fstat(fd, &st))
				return st
			}
			want, got := run(plain), run(sb.path())
			assert.Equal(t, want.Mode, got.Mode, "mode (chown by root clears set-user-ID on a non-directory)")
			assert.Equal(t, []uint32{want.Uid, want.Gid}, []uint32{got.Uid, got.Gid}, "owner")
			assert.Equal(t, want.Mtim, got.Mtim, "mtime")
			assert.Equal(t, want.Atim, got.Atim, "atime")
			assert.Equal(t, uint64(want.Nlink), uint64(got.Nlink), "links")
			assert.Equal(t, want.Size, got.Size, "size (ext4 empties a directory rmdir removes: 0; not one a rename replaces)")
			if kind == "replaced-dir" {
				assert.NotZero(t, want.Size, "ext4 keeps the size of a directory a rename replaced")
			}
			if kind != "replaced-dir" {
				_, err := os.Lstat(sb.upperPath(kind))
				assert.ErrorIs(t, err, os.ErrNotExist, "nothing of it in the upper layer")
			}
		})
	}
}
