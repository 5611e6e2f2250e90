package manager

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Mount mounts an unmounted active sandbox again at its recorded
// mountpoint, in the process that serves the others (the testdaemon):
// its changes show again, a second Mount is refused (already mounted), a
// mountpoint that is not empty is refused, the manager's own mountpoint
// is made again when it went away, one a symlink now leads to is refused,
// and the sandbox still commits.
func TestMountAgain(t *testing.T) {
	root := t.TempDir()
	orig := makeTree(t, fixtureFiles)
	d := startDaemon(t, root, orig)
	upper := filepath.Join(root, "sandboxes", d.id, "upper")
	require.NoError(t, os.WriteFile(filepath.Join(d.mnt, "kept"), []byte("kept"), 0o644))

	d.send("unmount " + d.id)
	require.Empty(t, d.answer().Err)
	assert.False(t, mounted(d.mnt))
	assert.Equal(t, "kept", readFile(t, upper, "kept"), "the changes stay in the upper")
	assert.NoFileExists(t, filepath.Join(d.mnt, "kept"))

	d.send("mount " + d.id)
	a := d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, d.id, a.Result.ID)
	assert.Equal(t, Active, a.Result.State, "the state does not change")
	assert.True(t, a.Result.Mounted, "the registry records the mount")
	assert.True(t, mounted(d.mnt))
	assert.Equal(t, "kept", readFile(t, d.mnt, "kept"), "the changes show again")
	assert.Equal(t, "old", readFile(t, d.mnt, "f"))

	d.send("mount " + d.id)
	assert.Contains(t, d.answer().Err, "already mounted")
	assert.True(t, mounted(d.mnt), "the mount stays")
	d.send("mount 0123456789abcdef")
	assert.Contains(t, d.answer().Err, ErrNotFound.Error())

	// Something else mounted at the mountpoint: refused (busy).
	d.send("unmount " + d.id)
	require.Empty(t, d.answer().Err)
	require.NoError(t, unix.Mount("tmpfs", d.mnt, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() {
		if mounted(d.mnt) {
			_ = lazyDetach(d.mnt)
		}
	})
	d.send("mount " + d.id)
	assert.Contains(t, d.answer().Err, "is already a mount point (tmpfs")
	require.NoError(t, unix.Unmount(d.mnt, 0))
	assert.False(t, mounted(d.mnt))

	// Something written into the bare mountpoint would be hidden: refused.
	require.NoError(t, os.WriteFile(filepath.Join(d.mnt, "stray"), nil, 0o644))
	d.send("mount " + d.id)
	assert.Contains(t, d.answer().Err, "is not empty")
	assert.False(t, mounted(d.mnt))
	// The manager's own mountpoint is made again.
	require.NoError(t, os.RemoveAll(d.mnt))
	d.send("mount " + d.id)
	require.Empty(t, d.answer().Err)
	assert.True(t, mounted(d.mnt))
	assert.Equal(t, "kept", readFile(t, d.mnt, "kept"))

	// A symlink where the mountpoint was, put there by someone who may
	// write its parent: refused, and what it points to is not covered
	// (the daemon's mount at its restart goes the same way).
	d.send("unmount " + d.id)
	require.Empty(t, d.answer().Err)
	victim := t.TempDir()
	t.Cleanup(func() {
		if mounted(victim) { // only when this test fails
			_ = lazyDetach(victim)
		}
	})
	require.NoError(t, os.Remove(d.mnt))
	require.NoError(t, os.Symlink(victim, d.mnt))
	d.send("mount " + d.id)
	assert.Contains(t, d.answer().Err, "a symlink on the way")
	assert.False(t, mounted(victim), "the symlink's target is not covered")
	require.NoError(t, os.Remove(d.mnt))
	d.send("mount " + d.id)
	require.Empty(t, d.answer().Err)
	assert.True(t, mounted(d.mnt))

	// Mounted again, it commits as any mounted sandbox (frozen, then
	// unmounted); a committed sandbox does not mount.
	require.NoError(t, os.WriteFile(filepath.Join(d.mnt, "later"), []byte("later"), 0o644))
	d.send("commit wait=5s")
	a = d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, []string{d.id}, a.Result.Committed)
	assert.Equal(t, "kept", readFile(t, orig, "kept"))
	assert.Equal(t, "later", readFile(t, orig, "later"))
	assert.False(t, mounted(d.mnt))
	d.send("mount " + d.id)
	assert.Contains(t, d.answer().Err, ErrNotActive.Error())
	assert.False(t, mounted(d.mnt))
}

// Nested sandboxes mount again parents first: the child of an unmounted
// parent is refused (ErrParentUnmounted, naming the parent); once the
// parent is mounted the child mounts and shows both sets of changes, and
// the plan commits child into parent, then the parent.
func TestMountAgainNested(t *testing.T) {
	np := startNested(t)
	np.d.send("unmount " + np.a)
	assert.Contains(t, np.d.answer().Err, ErrNested.Error(), "the parent cannot go from under its child")
	np.d.send("unmount " + np.b)
	require.Empty(t, np.d.answer().Err)
	np.d.send("unmount " + np.a)
	require.Empty(t, np.d.answer().Err)
	assert.False(t, mounted(np.aMnt))
	assert.False(t, mounted(np.bMnt))

	np.d.send("mount " + np.b)
	err := np.d.answer().Err
	assert.Contains(t, err, ErrParentUnmounted.Error())
	assert.Contains(t, err, "mount sandbox "+np.a+" first")
	assert.False(t, mounted(np.bMnt))

	np.d.send("mount " + np.a)
	require.Empty(t, np.d.answer().Err)
	np.d.send("mount " + np.b)
	a := np.d.answer()
	require.Empty(t, a.Err)
	assert.True(t, a.Result.Mounted)
	assert.True(t, mounted(np.aMnt))
	assert.True(t, mounted(np.bMnt))
	assert.Equal(t, "A\n", readFile(t, np.bMnt, "a.txt"), "the child sees its parent's changes")
	assert.Equal(t, "B\n", readFile(t, np.bMnt, "b.txt"))
	assert.Equal(t, "b\n", readFile(t, np.aMnt, "b.txt"))

	np.d.send("commit")
	a = np.d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, []string{np.b, np.a}, a.Result.Committed)
	assert.Equal(t, nestedAllNew, snapshot(t, np.orig))
}

// The mount request on the daemon socket, and what a manager that does
// not mount (Options.Mount false) answers: it refuses (invalid); unknown
// ids and sandboxes that are not active get the errors of every other
// request.
func TestDaemonMountRequest(t *testing.T) {
	m := open(t, t.TempDir())
	_, d := serveDaemon(t, m)
	fx := newFixture(t, m, "p", 1)

	_, err := d.Mount("0123456789abcdef")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Equal(t, CodeNotFound, ErrorCode(err))
	assert.Equal(t, CodeInvalid, rawCall(t, m.StateRoot(), `{"op":"mount"}`).Code, "mount needs an id")
	_, err = d.Mount(fx.ids[0])
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "unmounted")
	_, err = m.Mount(ctx, fx.ids[0])
	assert.ErrorIs(t, err, ErrInvalid)

	_, err = d.Destroy(Target{ID: fx.ids[0]})
	require.NoError(t, err)
	_, err = d.Mount(fx.ids[0])
	assert.ErrorIs(t, err, ErrNotActive)
	assert.Equal(t, CodeIllegalMove, ErrorCode(err))

	for _, e := range []error{ErrMounted, ErrParentUnmounted} {
		assert.Equal(t, CodeBusy, ErrorCode(fmt.Errorf("x: %w", e)), "%v", e)
	}
}
