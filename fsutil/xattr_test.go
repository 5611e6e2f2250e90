package fsutil

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// requireUserXattrs skips the test when the filesystem of dir does not
// support user.* extended attributes.
func requireUserXattrs(t *testing.T, dir string) {
	t.Helper()
	p := filepath.Join(dir, ".xattr-probe")
	require.NoError(t, os.WriteFile(p, nil, 0o600))
	defer os.Remove(p)
	err := unix.Setxattr(p, "user.probe", []byte("1"), 0)
	if errors.Is(err, unix.ENOTSUP) {
		t.Skipf("no user xattrs in %s: %v", dir, err)
	}
	require.NoError(t, err)
}

func TestGetXattr(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	requireUserXattrs(t, dir)
	p := filepath.Join(dir, "f")
	fd := createEmpty(t, p)
	big := pattern(int(xattrFirstBuf)*3+17, 1) // forces the ERANGE growth path
	vals := map[string][]byte{
		"user.empty":  {},
		"user.binary": {0, 1, 2, 0, 255, '\n'},
		"user.big":    big,
	}
	for name, v := range vals {
		require.NoError(t, unix.Fsetxattr(fd, name, v, 0))
	}

	names, err := ListXattrs(fd)
	require.NoError(t, err)
	lnames, err := LListXattrs(p)
	require.NoError(t, err)
	for name, want := range vals {
		assert.Contains(t, names, name)
		assert.Contains(t, lnames, name)
		got, err := GetXattr(fd, name)
		require.NoError(t, err, name)
		assert.True(t, bytes.Equal(want, got), "GetXattr %s", name)
		got, err = LGetXattr(p, name)
		require.NoError(t, err, name)
		assert.True(t, bytes.Equal(want, got), "LGetXattr %s", name)
	}

	// What one call returns is its own: the next call's buffer (the
	// calls share their first buffers) leaves it as it was.
	first, err := GetXattr(fd, "user.binary")
	require.NoError(t, err)
	for range 3 {
		_, err = LGetXattr(p, "user.big")
		require.NoError(t, err)
		_, err = GetXattr(fd, "user.empty")
		require.NoError(t, err)
	}
	assert.Equal(t, vals["user.binary"], first)

	// A list of names longer than the first buffer (on a file of its
	// own: ext4 keeps a file's attributes in one block).
	fd2 := createEmpty(t, filepath.Join(dir, "g"))
	var many []string
	for i := range 40 {
		many = append(many, fmt.Sprintf("user.a-rather-long-attribute-name-%03d", i))
		require.NoError(t, unix.Fsetxattr(fd2, many[i], nil, 0))
	}
	names, err = ListXattrs(fd2)
	require.NoError(t, err)
	assert.ElementsMatch(t, many, names)
	assert.Greater(t, 40*len(many[0]), int(xattrFirstBuf))

	_, err = GetXattr(fd, "user.missing")
	assert.ErrorIs(t, err, unix.ENODATA)
	_, err = LGetXattr(p, "user.missing")
	assert.ErrorIs(t, err, unix.ENODATA)
	_, err = ListXattrs(1 << 20)
	assert.ErrorIs(t, err, unix.EBADF)
}

// TestLXattrsNoFollow checks that the path variants read the symlink itself,
// not its target.
func TestLXattrsNoFollow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	requireUserXattrs(t, dir)
	target := filepath.Join(dir, "target")
	require.NoError(t, os.WriteFile(target, nil, 0o600))
	require.NoError(t, unix.Setxattr(target, "user.a", []byte("v"), 0))
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink("target", link))

	names, err := LListXattrs(link)
	require.NoError(t, err)
	assert.NotContains(t, names, "user.a")
	_, err = LGetXattr(link, "user.a")
	assert.Error(t, err)
}

func TestCopyXattrs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	requireUserXattrs(t, dir)
	src := createEmpty(t, filepath.Join(dir, "src"))
	want := map[string][]byte{
		"user.a":   []byte("alpha"),
		"user.bin": {0, 0xff, '\n', 0},
		"user.big": pattern(3000, 3), // > xattrFirstBuf, < the 4 KiB ext4 limit
	}
	for name, v := range want {
		require.NoError(t, unix.Fsetxattr(src, name, v, 0))
	}
	require.NoError(t, unix.Fsetxattr(src, "user.skip-me", []byte("x"), 0))

	tests := []struct {
		name string
		skip func(string) bool
		want []string
	}{
		{name: "all", want: []string{"user.a", "user.bin", "user.big", "user.skip-me"}},
		{
			name: "skip one",
			skip: func(n string) bool { return n == "user.skip-me" },
			want: []string{"user.a", "user.bin", "user.big"},
		},
	}
	for _, tc := range tests {
		dst := createEmpty(t, filepath.Join(dir, "dst-"+tc.name))
		require.NoError(t, CopyXattrs(dst, src, tc.skip), tc.name)
		names, err := ListXattrs(dst)
		require.NoError(t, err)
		assert.ElementsMatch(t, tc.want, userNames(names), tc.name)
		for name, v := range want {
			got, err := GetXattr(dst, name)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(v, got), "%s: value of %s", tc.name, name)
		}
	}

	assert.ErrorIs(t, CopyXattrs(1<<20, src, nil), unix.EBADF, "bad destination")
}

// userNames keeps the user.* names: the filesystem may add security.* ones.
func userNames(names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "user.") {
			out = append(out, n)
		}
	}
	return out
}

func TestIgnorableSetErr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "trusted.overlay.opaque", err: unix.EPERM, want: true},
		{name: "security.selinux", err: unix.EOPNOTSUPP, want: true},
		{name: "security.capability", err: unix.EPERM, want: true},
		{name: "trusted.x", err: unix.ENOSPC},
		{name: "user.a", err: unix.EPERM},
		{name: "user.a", err: unix.EOPNOTSUPP},
		{name: "system.posix_acl_access", err: unix.EPERM},
		{name: "trustedx", err: unix.EPERM},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, ignorableSetErr(tc.name, tc.err), "%s %v", tc.name, tc.err)
	}
}
