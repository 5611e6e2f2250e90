package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func init() {
	extraHelpers["make-objects"] = makeObjects
}

// makeObjectNames are the objects the make-objects helper makes.
var makeObjectNames = []string{"f", "x", "sub", "fifo", "tmp", "sym"}

// makeObjects (helper make-objects; args: umask in octal, directory,
// prefix) makes, under that umask, one object of each kind a process
// makes in dir, named prefix+name: a file asked 0666 and one 0777
// (open O_CREAT), a directory 0777, a FIFO 0666, a file 0666 made
// O_TMPFILE and then linked in, a symlink.
func makeObjects(args []string) int {
	umask, err := strconv.ParseUint(args[0], 8, 32)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	unix.Umask(int(umask))
	dir, prefix := args[1], args[2]
	p := func(name string) string { return filepath.Join(dir, prefix+name) }
	create := func(name string, mode uint32) error {
		fd, err := unix.Open(p(name), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, mode)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
	tmpfile := func() error {
		fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY, 0o666)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, p("tmp"), unix.AT_SYMLINK_FOLLOW)
	}
	for _, step := range []error{
		create("f", 0o666),
		create("x", 0o777),
		unix.Mkdir(p("sub"), 0o777),
		unix.Mkfifo(p("fifo"), 0o666),
		tmpfile(),
		unix.Symlink("f", p("sym")),
	} {
		if step != nil {
			fmt.Fprintln(os.Stderr, step)
			return 1
		}
	}
	return 0
}

// requireACLTools fails the test without the acl tools (which
// scripts/install-deps.sh installs); it needs the CLI too.
func requireACLTools(t *testing.T) {
	t.Helper()
	requireCLI(t)
	for _, tool := range []string{"setfacl", "getfacl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install acl (scripts/install-deps.sh)", tool)
		}
	}
}

// runOK runs name with args (10 s at most) and returns its output; a
// failure fails the test.
func runOK(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := runTimeout(10*time.Second, name, args...)
	require.NoError(t, err, "%s %v: %s", name, args, out)
	return string(out)
}

// TestPosixACLs: POSIX ACLs count in the permission checks of the mount
// as on ext4 (the kernel checks them: the mount negotiates FUSE_POSIX_ACL),
// setfacl through the mount changes the mode as on ext4, and a commit
// carries the ACL to the original. Each step is done on a plain
// directory too, and nobody's access and getfacl's output compared.
func TestPosixACLs(t *testing.T) {
	requireACLTools(t)
	files := map[string]string{"denied": "secret\n", "granted": "shared\n", "later": "later\n"}
	orig := newOrig(t, files)
	ref := newOrig(t, files)
	openParents(t, orig)
	openParents(t, ref)
	sb := mountSandbox(t, orig, withAllowOther())
	openParents(t, sb.mnt)

	run := func(name string, args ...string) string { return runOK(t, name, args...) }
	for _, root := range []string{orig, ref} {
		require.NoError(t, os.Chmod(filepath.Join(root, "denied"), 0o644))
		run("setfacl", "-m", "u:nobody:---", filepath.Join(root, "denied"))
		require.NoError(t, os.Chmod(filepath.Join(root, "granted"), 0o600))
		run("setfacl", "-m", "u:nobody:r--", filepath.Join(root, "granted"))
		require.NoError(t, os.Chmod(filepath.Join(root, "later"), 0o600))
	}
	// Through the mount and on the plain directory alike: an ACL set now.
	for _, root := range []string{sb.mnt, ref} {
		run("setfacl", "-m", "u:nobody:rw-", filepath.Join(root, "later"))
	}

	nobodyReads := func(p string) bool {
		return nobodyCmd(t, "cat", p).Run() == nil
	}
	nobodyAppends := func(p string) bool {
		return nobodyCmd(t, "sh", "-c", `echo more >> "$0"`, p).Run() == nil
	}
	for _, name := range []string{"denied", "granted", "later"} {
		assert.Equal(t, nobodyReads(filepath.Join(ref, name)), nobodyReads(sb.path(name)), "nobody reads %s", name)
		assert.Equal(t, run("getfacl", "-cp", filepath.Join(ref, name)), run("getfacl", "-cp", sb.path(name)), "getfacl %s", name)
		assert.Equal(t, lstat(t, filepath.Join(ref, name)).Mode, lstat(t, sb.path(name)).Mode, "mode of %s", name)
	}
	assert.False(t, nobodyReads(sb.path("denied")), "an ACL entry denying nobody is honoured")
	assert.True(t, nobodyReads(sb.path("granted")), "an ACL entry granting nobody is honoured")
	assert.True(t, nobodyAppends(sb.path("later")), "an ACL set through the mount grants")
	assert.True(t, nobodyAppends(filepath.Join(ref, "later")))
	assert.Equal(t, mustRead(t, filepath.Join(ref, "later")), mustRead(t, sb.path("later")))

	r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)
	got := run("getfacl", "-cp", filepath.Join(orig, "later"))
	assert.Equal(t, run("getfacl", "-cp", filepath.Join(ref, "later")), got, "the commit carries the ACL")
	assert.True(t, strings.Contains(got, "user:nobody:rw-"), got)
}

// TestDefaultACLInheritance: objects made in a directory with a default
// ACL get their permissions from it and not from the umask, as on ext4
// (the mount negotiates FUSE_DONT_MASK): files, directories (which keep
// the default ACL), FIFOs, O_TMPFILE files linked in, under umasks 022,
// 027 and 077, in a directory of the original with a default ACL that has
// named entries, in one with a default ACL equivalent to a mode, and in a
// plain one (the umask applies). Objects made where the sandbox removed
// an original object (made aside and moved over its whiteout) too. Each
// step is done on a plain directory as well; modes and getfacl's output
// must match, in the mount and in the original after the commit.
func TestDefaultACLInheritance(t *testing.T) {
	requireACLTools(t)
	files := map[string]string{"named/old-f": "o\n", "named/old-x": "o\n", "named/old-sub/inner": "o\n", "equiv/keep": "k\n", "plain/keep": "k\n"}
	orig := newOrig(t, files)
	ref := newOrig(t, files)
	run := func(dir, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %v in %s: %s", name, args, dir, out)
		return string(out)
	}
	for _, root := range []string{orig, ref} {
		run(root, "setfacl", "-d", "-m", "u:nobody:rwx,g::r-x,o::r--", "named")
		run(root, "setfacl", "-d", "-m", "u::rwx,g::r-x,o::---", "equiv")
	}
	sb := mountSandbox(t, orig)

	var names []string
	for _, root := range []string{sb.mnt, ref} {
		run(root, "rm", "-r", "named/old-f", "named/old-x", "named/old-sub")
		for _, umask := range []string{"022", "027", "077"} {
			for _, dir := range []string{"named", "equiv", "plain"} {
				prefix := umask + "-"
				out, err := helperCmd(t, "make-objects", umask, filepath.Join(root, dir), prefix).CombinedOutput()
				require.NoError(t, err, "make-objects %s in %s: %s", umask, filepath.Join(root, dir), out)
				if root == ref {
					for _, n := range makeObjectNames {
						names = append(names, filepath.Join(dir, prefix+n))
					}
				}
			}
		}
		out, err := helperCmd(t, "make-objects", "027", filepath.Join(root, "named"), "old-").CombinedOutput()
		require.NoError(t, err, "make-objects over whiteouts in %s: %s", root, out)
	}
	for _, n := range makeObjectNames {
		names = append(names, filepath.Join("named", "old-"+n))
	}

	compare := func(what, root string) {
		t.Helper()
		for _, name := range names {
			want, got := lstat(t, filepath.Join(ref, name)), lstat(t, filepath.Join(root, name))
			assert.Equal(t, fmt.Sprintf("%o", want.Mode), fmt.Sprintf("%o", got.Mode), "%s: mode of %s", what, name)
			if want.Mode&unix.S_IFMT != unix.S_IFLNK {
				assert.Equal(t, run(ref, "getfacl", "-c", name), run(root, "getfacl", "-c", name), "%s: getfacl %s", what, name)
			}
		}
	}
	compare("the mount", sb.mnt)
	// The test sees what it means to: named entries were inherited.
	require.Contains(t, run(ref, "getfacl", "-c", "named/027-f"), "user:nobody:rwx")

	r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)
	compare("the original after the commit", orig)
}

// TestRootAttributesAreKept: the original's root directory has an ACL, a
// default ACL and a user.* attribute. The mount's root shows them, a file
// made in it inherits the default ACL, and after a chmod of the root and
// its commit the original's root keeps them (as a chmod on ext4 would:
// only the ACL's mask follows the new group bits); a rollback with --keep
// before gives the root its original metadata back. Until 2026-11-27 the
// mount's root showed none of them, that commit removed them all, and
// the root kept the sandbox's mode and attributes after rollback --keep.
func TestRootAttributesAreKept(t *testing.T) {
	requireACLTools(t)
	orig, ref := newOrig(t, map[string]string{"f": "f\n"}), newOrig(t, map[string]string{"f": "f\n"})
	run := func(name string, args ...string) string { return runOK(t, name, args...) }
	for _, root := range []string{orig, ref} {
		run("setfacl", "-m", "u:nobody:rwx", "-d", "-m", "g:nogroup:r-x", root)
		require.NoError(t, unix.Setxattr(root, "user.project", []byte("sbxfs"), 0))
	}
	sb := mountSandbox(t, orig)
	assert.Equal(t, run("getfacl", "-cp", ref), run("getfacl", "-cp", sb.mnt), "the mount's root shows the original root's ACLs")
	v := make([]byte, 64)
	n, err := unix.Getxattr(sb.mnt, "user.project", v)
	if assert.NoError(t, err, "the mount's root shows the original root's attributes") {
		assert.Equal(t, "sbxfs", string(v[:n]))
	}
	for _, root := range []string{sb.mnt, ref} {
		require.NoError(t, os.WriteFile(filepath.Join(root, "new"), []byte("n\n"), 0o666))
		require.NoError(t, os.Chmod(root, 0o750))
	}
	assert.Equal(t, run("getfacl", "-cp", filepath.Join(ref, "new")), run("getfacl", "-cp", sb.path("new")), "a new file inherits the root's default ACL")

	// A rollback that keeps the mount gives the root back its original
	// metadata, as status says ("no changes"); before, the root kept the
	// sandbox's mode and attributes.
	before := run("getfacl", "-cp", orig)
	require.NoError(t, unix.Setxattr(sb.mnt, "user.extra", []byte("x"), 0))
	r := sbxfsCLI(t, cliTimeout, "rollback", "--keep", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)
	assert.Equal(t, before, run("getfacl", "-cp", sb.mnt), "the root after rollback --keep")
	_, err = unix.Getxattr(sb.mnt, "user.extra", v)
	assert.ErrorIs(t, err, unix.ENODATA, "the root's attribute set in the sandbox is gone")
	assert.Equal(t, lstat(t, orig).Mode, lstat(t, sb.mnt).Mode)
	for _, root := range []string{sb.mnt, ref} {
		require.NoError(t, os.WriteFile(filepath.Join(root, "new"), []byte("n\n"), 0o666))
		require.NoError(t, os.Chmod(root, 0o750))
	}

	r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)
	assert.Equal(t, run("getfacl", "-cp", ref), run("getfacl", "-cp", orig), "the committed root keeps its ACLs")
	n, err = unix.Getxattr(orig, "user.project", v)
	if assert.NoError(t, err, "the committed root keeps its attributes") {
		assert.Equal(t, "sbxfs", string(v[:n]))
	}
}
