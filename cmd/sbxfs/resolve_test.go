package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/commit"
)

// TestResolveConflicts drives a conflict to a commit as a user would: the
// commit refuses and says how to go on, resolve lists the conflicts,
// refuses a path that is none, and settles the one merged in the mount;
// the commit then applies everything, the merge included.
func TestResolveConflicts(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin, f := mountedFixture(t)
	writeFile(t, filepath.Join(f.mnt, "a.txt"), "hello\nmine\n")
	writeFile(t, filepath.Join(f.mnt, "b.txt"), "b\n")
	r := runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.NotContains(t, r.stdout, "conflict", "nothing changed in the original yet")
	writeFile(t, filepath.Join(f.orig, "a.txt"), "theirs\nhello\n")

	// status tells what a commit would refuse on, before one is tried.
	r = runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "2 changes: 1 created, 1 modified\n1 conflict: a commit refuses it until 'sbxfs resolve "+f.mnt+" PATH' keeps the sandbox's version (or 'sbxfs commit --force')\n  a.txt: content changed in the original\n")
	r = runBin(t, bin, "status", "--json", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	assert.Equal(t, []commit.Conflict{{Path: "a.txt", Reason: "content changed in the original"}}, st.Conflicts)

	r = runBin(t, bin, "commit", f.mnt)
	assertFailure(t, r, exitConflict, "a.txt: content changed in the original")
	assert.Contains(t, r.stderr, "sbxfs resolve MOUNTPOINT PATH", "the message says what to do")

	r = runBin(t, bin, "resolve", "--json", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	var out resolveJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	assert.Empty(t, out.Resolved)
	assert.Equal(t, []commit.Conflict{{Path: "a.txt", Reason: "content changed in the original"}}, out.Conflicts)

	r = runBin(t, bin, "resolve", f.mnt, "b.txt")
	assertFailure(t, r, exitBadPath, "b.txt: not a conflict of this sandbox")
	r = runBin(t, bin, "resolve", f.mnt, "../a.txt")
	assertFailure(t, r, exitBadPath, "not a path inside the sandbox")
	r = runBin(t, bin, "commit", f.mnt)
	assertFailure(t, r, exitConflict, "a.txt") // a refused resolve records nothing

	// The merge, made in the mount, then resolved by the path inside it.
	writeFile(t, filepath.Join(f.mnt, "a.txt"), "theirs\nhello\nmine\n")
	r = runBin(t, bin, "resolve", f.mnt, filepath.Join(f.mnt, "a.txt"))
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "resolved a.txt (content changed in the original): the commit applies the sandbox's version of it\n")
	assert.Contains(t, r.stdout, "no conflicts")
	assertFile(t, filepath.Join(f.orig, "a.txt"), "theirs\nhello\n")
	r = runBin(t, bin, "status", "--json", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	st = statusJSON{}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	assert.Empty(t, st.Conflicts, "a resolved conflict is gone from status")
	assert.NotNil(t, st.Conflicts, "an empty list, not null")

	r = runBin(t, bin, "commit", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(f.orig, "a.txt"), "theirs\nhello\nmine\n")
	assertFile(t, filepath.Join(f.orig, "b.txt"), "b\n")
}

// TestRootConflict: the original's root gets an attribute after the
// sandbox was made, and the sandbox changes the root's mode. The commit
// refuses, naming the root "."; entries the original made in its root
// alone are no conflict. `resolve MOUNTPOINT .` (or the mountpoint itself)
// keeps the sandbox's version; the commit then applies the mode. Before,
// the commit applied the root's metadata and lost the attribute without
// a word.
func TestRootConflict(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin, f := mountedFixture(t)
	require.NoError(t, unix.Chmod(f.mnt, 0o700))
	writeFile(t, filepath.Join(f.orig, "made-in-the-original"), "o\n")
	r := runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.NotContains(t, r.stdout, "conflict", "entries the original made in its root are no conflict")

	require.NoError(t, unix.Setxattr(f.orig, "user.later", []byte("L"), 0))
	r = runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "1 conflict:")
	assert.Contains(t, r.stdout, "\n  .: changed in the original, and its owner or attributes differ from the sandbox's\n")
	r = runBin(t, bin, "commit", f.mnt)
	assertFailure(t, r, exitConflict, "\n  .: changed in the original")
	v := make([]byte, 8)
	n, err := unix.Getxattr(f.orig, "user.later", v)
	require.NoError(t, err, "nothing was applied")
	assert.Equal(t, "L", string(v[:n]))

	// ".", as status names the root; "", as --json does; the mountpoint.
	for i, arg := range []string{".", "", f.mnt} {
		r = runBin(t, bin, "resolve", f.mnt, arg)
		require.Equal(t, 0, r.code, "resolve %q: %s", arg, r.stderr)
		assert.Contains(t, r.stdout, "no conflicts")
		if arg != f.mnt {
			require.NoError(t, unix.Setxattr(f.orig, fmt.Sprintf("user.again%d", i), []byte("A"), 0))
		}
	}
	r = runBin(t, bin, "commit", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	var st unix.Stat_t
	require.NoError(t, unix.Stat(f.orig, &st))
	assert.Equal(t, uint32(0o700), st.Mode&0o7777, "the sandbox's mode is applied")
	_, err = unix.Getxattr(f.orig, "user.later", v)
	assert.ErrorIs(t, err, unix.ENODATA, "the sandbox's version, resolved, has no such attribute")
}

// TestKeptResetGivesTheRootBack: a rollback with --keep, of a mounted
// sandbox and of one unmounted, gives the root the original's mode and
// attributes again, as status says ("no changes"); a conflict on the root
// afterwards is measured from then.
func TestKeptResetGivesTheRootBack(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin, f := mountedFixture(t)
	var orig unix.Stat_t
	require.NoError(t, unix.Stat(f.orig, &orig))
	for _, mounted := range []bool{true, false} {
		require.NoError(t, unix.Chmod(f.mnt, 0o700))
		require.NoError(t, unix.Setxattr(f.mnt, "user.mine", []byte("m"), 0))
		target := f.mnt
		if !mounted {
			r := runBin(t, bin, "unmount", f.mnt)
			require.Equal(t, 0, r.code, r.stderr)
			target = f.dir
		}
		r := runBin(t, bin, "rollback", "--keep", target)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Empty(t, statusOf(t, target).Changes)
		if !mounted {
			r = runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
			require.Equal(t, 0, r.code, r.stderr)
		}
		var st unix.Stat_t
		require.NoError(t, unix.Stat(f.mnt, &st))
		assert.Equal(t, orig.Mode, st.Mode, "the root's mode after rollback --keep (mounted %v)", mounted)
		_, err := unix.Getxattr(f.mnt, "user.mine", make([]byte, 8))
		assert.ErrorIs(t, err, unix.ENODATA, "the root's attribute after rollback --keep (mounted %v)", mounted)
	}
	require.NoError(t, unix.Setxattr(f.orig, "user.theirs", []byte("t"), 0))
	require.NoError(t, unix.Chmod(f.mnt, 0o750))
	r := runBin(t, bin, "commit", f.mnt)
	assertFailure(t, r, exitConflict, "\n  .: changed in the original")
}
