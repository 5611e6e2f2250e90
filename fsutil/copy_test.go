package fsutil

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// sparseSpec describes a file: its size and the data written at some offsets;
// everything else is a hole.
type sparseSpec struct {
	size   int64
	chunks map[int64][]byte
}

// pattern returns n bytes that differ from a zeroed hole and from each other.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251) + 1
	}
	return b
}

var copyCases = []struct {
	name      string
	spec      sparseSpec
	maxBlocks int64 // upper bound of st_blocks (512-byte units) of the copy; 0 = no check
}{
	{name: "empty", spec: sparseSpec{}},
	{name: "small", spec: sparseSpec{size: 11, chunks: map[int64][]byte{0: []byte("hello world")}}},
	// Copied as one range: the holes come out as zeros, the size right.
	{name: "small with holes", spec: sparseSpec{size: 64 * kib, chunks: map[int64][]byte{100: pattern(50, 6), 40 * kib: pattern(300, 8)}}},
	{name: "small with trailing hole", spec: sparseSpec{size: 60 * kib, chunks: map[int64][]byte{0: pattern(10, 9)}}},
	{name: "several buffers", spec: sparseSpec{size: 3*mib + 5, chunks: map[int64][]byte{0: pattern(int(3*mib+5), 7)}}},
	{
		name:      "trailing hole",
		spec:      sparseSpec{size: 10 * mib, chunks: map[int64][]byte{0: pattern(int(4*kib), 1)}},
		maxBlocks: 1024,
	},
	{
		name:      "leading hole",
		spec:      sparseSpec{size: 4*mib + 100, chunks: map[int64][]byte{3 * mib: pattern(100, 2)}},
		maxBlocks: 1024,
	},
	{
		name: "sparse 5 GiB",
		spec: sparseSpec{size: 5 * gib, chunks: map[int64][]byte{
			0:             pattern(int(64*kib), 3),
			gib:           pattern(int(4*kib), 4),
			4*gib + gib/2: pattern(int(4*kib), 5),
		}},
		maxBlocks: 16 * mib / 512,
	},
}

// makeSparse creates path as described by spec and returns an fd open on it.
func makeSparse(t *testing.T, path string, spec sparseSpec) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	for off, data := range spec.chunks {
		_, err := unix.Pwrite(fd, data, off)
		require.NoError(t, err)
	}
	require.NoError(t, unix.Ftruncate(fd, spec.size))
	return fd
}

// createEmpty creates path and returns an fd open for reading and writing.
func createEmpty(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// checkCopy asserts that the file open as fd matches spec.
func checkCopy(t *testing.T, fd int, spec sparseSpec, maxBlocks int64) {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	assert.Equal(t, spec.size, st.Size, "size")
	if maxBlocks > 0 {
		assert.LessOrEqual(t, st.Blocks, maxBlocks, "allocated blocks: holes not kept")
	}
	for off, want := range spec.chunks {
		got := make([]byte, len(want)+1)
		n, err := unix.Pread(fd, got, off)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(want, got[:min(n, len(want))]), "content at %d", off)
		if off+int64(len(want)) < spec.size {
			assert.Equal(t, byte(0), got[len(want)], "hole after chunk at %d", off)
		}
		if off > 0 {
			before := make([]byte, 1)
			_, err := unix.Pread(fd, before, off-1)
			require.NoError(t, err)
			assert.Equal(t, byte(0), before[0], "hole before chunk at %d", off)
		}
	}
}

func TestCopyData(t *testing.T) {
	t.Parallel()
	for _, tc := range copyCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := makeSparse(t, filepath.Join(dir, "src"), tc.spec)
			dst := createEmpty(t, filepath.Join(dir, "dst"))
			require.NoError(t, CopyData(dst, src))
			checkCopy(t, dst, tc.spec, tc.maxBlocks)
		})
	}
}

// TestCopyDataPreadFallback forces the pread/pwrite path that is taken when
// copy_file_range cannot copy between the two filesystems.
func TestCopyDataPreadFallback(t *testing.T) {
	t.Parallel()
	for _, tc := range copyCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := makeSparse(t, filepath.Join(dir, "src"), tc.spec)
			dst := createEmpty(t, filepath.Join(dir, "dst"))
			require.NoError(t, copySparse(&copier{dst: dst, src: src, noCFR: true}, tc.spec.size))
			checkCopy(t, dst, tc.spec, tc.maxBlocks)
		})
	}
}

// TestCopyDataShrunkSource copies with a size larger than the source, as if
// the source shrank after the fstat: the copy ends where the source ends.
func TestCopyDataShrunkSource(t *testing.T) {
	t.Parallel()
	for _, noCFR := range []bool{false, true} {
		dir := t.TempDir()
		data := pattern(int(2*mib), 9)
		src := makeSparse(t, filepath.Join(dir, "src"), sparseSpec{size: int64(len(data)), chunks: map[int64][]byte{0: data}})
		dst := createEmpty(t, filepath.Join(dir, "dst"))
		require.NoError(t, copySparse(&copier{dst: dst, src: src, noCFR: noCFR}, 3*mib))
		got, err := os.ReadFile(filepath.Join(dir, "dst"))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(data, got), "noCFR=%v: copy of a shrunk source", noCFR)
	}
}

func TestCopyDataErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	fifoFd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fifoFd) })
	src := makeSparse(t, filepath.Join(dir, "src"), sparseSpec{size: 5, chunks: map[int64][]byte{0: []byte("hello")}})
	roDst, err := unix.Open(filepath.Join(dir, "src"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(roDst) })

	tests := []struct {
		name     string
		dst, src int
		want     error
	}{
		{name: "fifo source", dst: createEmpty(t, filepath.Join(dir, "d1")), src: fifoFd, want: unix.EINVAL},
		{name: "closed source", dst: createEmpty(t, filepath.Join(dir, "d2")), src: 1 << 20, want: unix.EBADF},
		{name: "read-only destination", dst: roDst, src: src, want: unix.EBADF},
	}
	for _, tc := range tests {
		err := CopyData(tc.dst, tc.src)
		assert.ErrorIs(t, err, tc.want, tc.name)
	}
}

func TestCopyTimes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := makeSparse(t, filepath.Join(dir, "src"), sparseSpec{})
	dst := createEmpty(t, filepath.Join(dir, "dst"))
	ts := []unix.Timespec{{Sec: 1_000_000_000, Nsec: 123_456_789}, {Sec: 1_500_000_000, Nsec: 987_654_321}}
	require.NoError(t, unix.UtimesNano(filepath.Join(dir, "src"), ts))
	var st, got unix.Stat_t
	require.NoError(t, unix.Fstat(src, &st))

	require.NoError(t, CopyTimes(dst, &st))
	require.NoError(t, unix.Fstat(dst, &got))
	assert.Equal(t, ts[0], got.Atim, "atime")
	assert.Equal(t, ts[1], got.Mtim, "mtime")
	assert.ErrorIs(t, CopyTimes(1<<20, &st), unix.EBADF)
}

func TestIsWhiteout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		st   unix.Stat_t
		want bool
	}{
		{name: "char 0/0", st: unix.Stat_t{Mode: unix.S_IFCHR | 0o000}, want: true},
		{name: "char 0/0 with perms", st: unix.Stat_t{Mode: unix.S_IFCHR | 0o644}, want: true},
		{name: "char 1/3", st: unix.Stat_t{Mode: unix.S_IFCHR, Rdev: unix.Mkdev(1, 3)}},
		{name: "block 0/0", st: unix.Stat_t{Mode: unix.S_IFBLK}},
		{name: "regular", st: unix.Stat_t{Mode: unix.S_IFREG}},
		{name: "fifo", st: unix.Stat_t{Mode: unix.S_IFIFO}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, IsWhiteout(&tc.st), tc.name)
	}
}

// TestIsWhiteoutReal checks a whiteout made with mknod, as overlayfs makes
// them; it needs CAP_MKNOD.
func TestIsWhiteoutReal(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "wh")
	if err := unix.Mknod(p, unix.S_IFCHR|0o000, 0); err != nil {
		t.Skipf("mknod whiteout: %v", err)
	}
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(p, &st))
	assert.True(t, IsWhiteout(&st))
}
