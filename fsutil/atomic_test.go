package fsutil

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// dirNames lists the names in dir.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFileAtomic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		target   string
		existing string // content of an existing target; "" = none
		data     string
	}{
		{name: "new file", target: "target", data: "new"},
		{name: "empty data", target: "target", data: ""},
		{name: "replaces existing", target: "target", existing: "old content", data: "replaced"},
		{name: "255-byte name", target: strings.Repeat("n", 255), data: "long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			p := filepath.Join(dir, tc.target)
			if tc.existing != "" {
				require.NoError(t, os.WriteFile(p, []byte(tc.existing), 0o644))
			}
			require.NoError(t, WriteFileAtomic(p, []byte(tc.data), 0o600))
			got, err := os.ReadFile(p)
			require.NoError(t, err)
			assert.Equal(t, tc.data, string(got))
			fi, err := os.Stat(p)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
			assert.Equal(t, []string{tc.target}, dirNames(t, dir), "no temp file left")
		})
	}
}

// TestWriteFileAtomicSymlink checks that a symlink at the target is replaced,
// never written through.
func TestWriteFileAtomicSymlink(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	require.NoError(t, os.WriteFile(outside, []byte("keep"), 0o644))
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(outside, link))

	require.NoError(t, WriteFileAtomic(link, []byte("new"), 0o644))
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	assert.True(t, fi.Mode().IsRegular(), "link replaced by a regular file")
	got, err := os.ReadFile(outside)
	require.NoError(t, err)
	assert.Equal(t, "keep", string(got))
}

func TestWriteFileAtomicErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the target
		want  error
	}{
		{
			name: "target is a non-empty directory",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "target")
				require.NoError(t, os.MkdirAll(filepath.Join(p, "child"), 0o755))
				return p
			},
			want: syscall.EISDIR,
		},
		{
			name: "missing directory",
			setup: func(t *testing.T, dir string) string {
				return filepath.Join(dir, "missing", "target")
			},
			want: syscall.ENOENT,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			p := tc.setup(t, dir)
			before := dirNames(t, dir)
			err := WriteFileAtomic(p, []byte("data"), 0o644)
			assert.ErrorIs(t, err, tc.want)
			assert.Equal(t, before, dirNames(t, dir), "no temp file left")
		})
	}
}

func TestSyncDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	tests := []struct {
		path string
		want error
	}{
		{path: dir},
		{path: file, want: unix.ENOTDIR},
		{path: filepath.Join(dir, "missing"), want: unix.ENOENT},
	}
	for _, tc := range tests {
		err := SyncDir(tc.path)
		if tc.want == nil {
			assert.NoError(t, err, tc.path)
		} else {
			assert.ErrorIs(t, err, tc.want, tc.path)
		}
	}
}

func TestTempName(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(`^\.pre-[0-9a-f]{16}$`)
	seen := map[string]bool{}
	for range 1000 {
		n := TempName(".pre-")
		assert.Regexp(t, re, n)
		assert.False(t, seen[n], "duplicate %s", n)
		seen[n] = true
	}
}
