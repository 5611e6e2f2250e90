package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPosixACLs: POSIX ACLs count in the permission checks of the mount
// as on ext4 (the kernel checks them: the mount negotiates FUSE_POSIX_ACL),
// setfacl through the mount changes the mode as on ext4, and a commit
// carries the ACL to the original. Each step is done on a plain
// directory too, and nobody's access and getfacl's output compared.
func TestPosixACLs(t *testing.T) {
	requireCLI(t)
	for _, tool := range []string{"setfacl", "getfacl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install acl (scripts/install-deps.sh)", tool)
		}
	}
	files := map[string]string{"denied": "secret\n", "granted": "shared\n", "later": "later\n"}
	orig := newOrig(t, files)
	ref := newOrig(t, files)
	openParents(t, orig)
	openParents(t, ref)
	sb := mountSandbox(t, orig, withAllowOther())
	openParents(t, sb.mnt)

	run := func(name string, args ...string) string {
		t.Helper()
		out, err := runTimeout(10*time.Second, name, args...)
		require.NoError(t, err, "%s %v: %s", name, args, out)
		return string(out)
	}
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
