package fsutil

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// beneathTree builds, in a temp dir:
//
//	outside/secret          a file the tests must never reach
//	root/file               "top"
//	root/dir/file           "inside"
//	root/dir/sub/
//	root/dir/link-last  ->  ../file
//	root/link-mid       ->  dir
//	root/link-out       ->  ../outside
//	root/link-abs       ->  /etc
//	root/dangling       ->  ../outside/created
//
// It returns the root path (symlinks resolved), an O_PATH fd on it and the
// outside directory.
func beneathTree(t testing.TB) (root string, rootFd int, outside string) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dir", "sub"), 0o755))
	require.NoError(t, os.MkdirAll(outside, 0o755))
	files := map[string]string{
		filepath.Join(outside, "secret"):   "secret",
		filepath.Join(root, "file"):        "top",
		filepath.Join(root, "dir", "file"): "inside",
	}
	for p, data := range files {
		require.NoError(t, os.WriteFile(p, []byte(data), 0o644))
	}
	links := map[string]string{
		"dir/link-last": "../file",
		"link-mid":      "dir",
		"link-out":      "../outside",
		"link-abs":      "/etc",
		"dangling":      "../outside/created",
	}
	for name, target := range links {
		require.NoError(t, os.Symlink(target, filepath.Join(root, name)))
	}
	rootFd, err = unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(rootFd) })
	return root, rootFd, outside
}

// openImpls are the two implementations of OpenBeneath: openat2 (what runs
// on kernels since 5.6) and the component walk used without it.
var openImpls = map[string]func(rootFd int, rel string, flags int, mode uint32) (int, error){
	"openat2": OpenBeneath,
	"walk": func(rootFd int, rel string, flags int, mode uint32) (int, error) {
		clean, err := CleanRel(rel)
		if err != nil {
			return -1, err
		}
		return openWalk(rootFd, clean, flags, mode)
	},
}

// fdPath returns the path the kernel reports for fd.
func fdPath(t testing.TB, fd int) string {
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	require.NoError(t, err)
	return p
}

func TestOpenBeneath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		rel   string
		flags int
		want  string // path the fd must refer to, relative to root ("" = root)
		err   error
	}{
		{name: "file", rel: "file", flags: unix.O_RDONLY, want: "file"},
		{name: "nested", rel: "dir/file", flags: unix.O_RDONLY, want: "dir/file"},
		{name: "root", rel: "", flags: unix.O_RDONLY | unix.O_DIRECTORY, want: ""},
		{name: "unclean", rel: "dir//./sub/", flags: unix.O_PATH, want: "dir/sub"},
		{name: "symlink in the middle", rel: "link-mid/file", flags: unix.O_RDONLY, err: unix.ELOOP},
		{name: "symlink last", rel: "dir/link-last", flags: unix.O_RDONLY, err: unix.ELOOP},
		{name: "symlink last as directory", rel: "link-mid", flags: unix.O_PATH | unix.O_DIRECTORY, err: unix.ELOOP},
		{name: "symlink last O_PATH|O_NOFOLLOW", rel: "dir/link-last", flags: unix.O_PATH | unix.O_NOFOLLOW, want: "dir/link-last"},
		{name: "symlink out", rel: "link-out/secret", flags: unix.O_RDONLY, err: unix.ELOOP},
		{name: "absolute symlink", rel: "link-abs/passwd", flags: unix.O_RDONLY, err: unix.ELOOP},
		{name: "dotdot", rel: "../outside/secret", flags: unix.O_RDONLY, err: ErrPathEscapes},
		{name: "inner dotdot", rel: "dir/../file", flags: unix.O_RDONLY, err: ErrPathEscapes},
		{name: "absolute", rel: "/etc/passwd", flags: unix.O_RDONLY, err: ErrPathEscapes},
		{name: "missing", rel: "dir/missing", flags: unix.O_RDONLY, err: unix.ENOENT},
		{name: "file as directory", rel: "file/x", flags: unix.O_RDONLY, err: unix.ENOTDIR},
		{name: "create", rel: "dir/new", flags: unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL, want: "dir/new"},
		{name: "create through symlink", rel: "link-mid/new2", flags: unix.O_WRONLY | unix.O_CREAT, err: unix.ELOOP},
		{name: "create at dangling symlink", rel: "dangling", flags: unix.O_WRONLY | unix.O_CREAT, err: unix.ELOOP},
	}
	for impl, open := range openImpls {
		t.Run(impl, func(t *testing.T) {
			t.Parallel()
			root, rootFd, outside := beneathTree(t)
			for _, tc := range tests {
				fd, err := open(rootFd, tc.rel, tc.flags, 0o640)
				if tc.err != nil {
					assert.ErrorIs(t, err, tc.err, tc.name)
					assert.Equal(t, -1, fd, tc.name)
					continue
				}
				if !assert.NoError(t, err, tc.name) {
					continue
				}
				assert.Equal(t, filepath.Join(root, tc.want), fdPath(t, fd), tc.name)
				flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
				require.NoError(t, err)
				assert.NotZero(t, flags&unix.FD_CLOEXEC, "%s: O_CLOEXEC", tc.name)
				unix.Close(fd)
			}
			assert.NoFileExists(t, filepath.Join(outside, "created"))
			assert.NoFileExists(t, filepath.Join(root, "dir", "new2"))
			fi, err := os.Stat(filepath.Join(root, "dir", "new"))
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o640)&^currentUmask(), fi.Mode().Perm())
		})
	}
}

// currentUmask reads the process umask without changing it.
func currentUmask() os.FileMode {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			m, _ := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			return os.FileMode(m)
		}
	}
	return 0
}

func TestOpenDirBeneath(t *testing.T) {
	t.Parallel()
	root, rootFd, _ := beneathTree(t)
	tests := []struct {
		rel  string
		want string // the parent directory, relative to root
		err  error
	}{
		{rel: "file", want: ""},
		{rel: "dir/file", want: "dir"},
		{rel: "dir/sub/", want: "dir"},
		{rel: "dir/missing", want: "dir"},
		{rel: "dir/link-last", want: "dir"},
		{rel: "link-mid/file", err: unix.ELOOP},
		{rel: "link-out/secret", err: unix.ELOOP},
		{rel: "../x", err: ErrPathEscapes},
		{rel: "", err: unix.EINVAL},
		{rel: "missing/x", err: unix.ENOENT},
	}
	for _, tc := range tests {
		fd, err := OpenDirBeneath(rootFd, tc.rel)
		if tc.err != nil {
			assert.ErrorIs(t, err, tc.err, "%q", tc.rel)
			continue
		}
		if !assert.NoError(t, err, "%q", tc.rel) {
			continue
		}
		assert.Equal(t, filepath.Join(root, tc.want), fdPath(t, fd), "%q", tc.rel)
		var st unix.Stat_t
		clean, _ := CleanRel(tc.rel)
		err = unix.Fstatat(fd, filepath.Base(clean), &st, unix.AT_SYMLINK_NOFOLLOW)
		if tc.rel != "dir/missing" {
			assert.NoError(t, err, "fstatat on the last component of %q", tc.rel)
		}
		unix.Close(fd)
	}
}

// FuzzOpenBeneath opens arbitrary paths beneath a tree whose symlinks point
// out of it and checks that any fd returned refers to something inside.
func FuzzOpenBeneath(f *testing.F) {
	seeds := []string{
		"", "file", "dir/file", "link-out/secret", "link-abs/passwd", "../outside/secret",
		"link-mid/file", "dir/link-last", "dangling", "dir/../../outside", "/etc/passwd", "dir/sub/../..",
	}
	for i, s := range seeds {
		f.Add(s, uint8(i))    // openat2
		f.Add(s, uint8(i+16)) // walk
	}
	root, rootFd, outside := beneathTree(f)
	var outSt unix.Stat_t
	require.NoError(f, unix.Stat(filepath.Join(outside, "secret"), &outSt))
	flagSet := []int{unix.O_RDONLY, unix.O_PATH, unix.O_PATH | unix.O_NOFOLLOW, unix.O_RDONLY | unix.O_DIRECTORY}
	names := []string{"openat2", "walk"}

	f.Fuzz(func(t *testing.T, rel string, sel uint8) {
		flags := flagSet[int(sel)%len(flagSet)]
		open := openImpls[names[int(sel/16)%len(names)]]
		fd, err := open(rootFd, rel, flags, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		p := fdPath(t, fd)
		assert.True(t, p == root || strings.HasPrefix(p, root+"/"), "%q opened %q", rel, p)
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd, &st))
		assert.False(t, st.Dev == outSt.Dev && st.Ino == outSt.Ino, "%q opened the outside secret", rel)
	})
}
