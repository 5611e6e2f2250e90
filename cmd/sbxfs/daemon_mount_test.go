package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/manager"
)

// sbxfs mount ID (or the recorded mountpoint) of a managed sandbox that
// 'sbxfs unmount' took down: its daemon mounts it again with its changes,
// list says so, and it commits; a second mount exits 4 "already
// mounted"; a committed sandbox exits 10; an unknown id 6. The mounts
// are unmounted at the end by newManagedEnv's cleanup (the daemon
// stopped, anything left detached).
func TestManagedMountAgain(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	sb := e.create(o)
	writeFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	pid := e.daemonPid()

	r := e.sbxfs("unmount", sb.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, sb.Mountpoint))
	l := e.list()
	assert.Equal(t, manager.Active, l[sb.ID].State)
	assert.False(t, l[sb.ID].Mounted, "list shows it unmounted")
	assert.NoFileExists(t, filepath.Join(sb.Mountpoint, "kept"))

	r = e.sbxfs("mount", sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, sb.ID+"\t"+sb.Mountpoint+"\n", r.stdout)
	assert.True(t, isMounted(t, sb.Mountpoint))
	assertFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	assert.Equal(t, pid, e.daemonPid(), "the same daemon mounted it")
	l = e.list()
	assert.Equal(t, manager.Active, l[sb.ID].State)
	assert.True(t, l[sb.ID].Mounted, "list shows it mounted")

	// Already mounted: by id and by mountpoint.
	assertFailure(t, e.sbxfs("mount", sb.ID), exitBusy, "already mounted")
	assertFailure(t, e.sbxfs("mount", sb.Mountpoint), exitBusy, "already mounted")
	assert.True(t, isMounted(t, sb.Mountpoint))

	// By its mountpoint, with --json: the sandbox record, as create --json.
	require.Equal(t, 0, e.sbxfs("unmount", sb.Mountpoint).code)
	r = e.sbxfs("mount", "--json", sb.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	var got manager.SandboxInfo
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got), r.stdout)
	assert.Equal(t, sb.ID, got.ID)
	assert.Equal(t, sb.Mountpoint, got.Mountpoint)
	assert.Equal(t, sb.Original, got.Original)
	assert.Equal(t, manager.Active, got.State)
	assert.True(t, got.Mounted)

	// A lazily detached mount whose server still serves an open file is
	// not mounted over: two servers must not share one upper.
	open, err := os.Open(filepath.Join(sb.Mountpoint, "kept"))
	require.NoError(t, err)
	require.Equal(t, 0, e.sbxfs("unmount", "--lazy", sb.Mountpoint).code)
	assert.False(t, isMounted(t, sb.Mountpoint))
	assertFailure(t, e.sbxfs("mount", sb.ID), exitBusy, "close them")
	require.NoError(t, open.Close())
	assert.Eventually(t, func() bool { return e.sbxfs("mount", sb.ID).code == 0 }, 10*time.Second, 100*time.Millisecond,
		"once the last file is closed the server finishes and the sandbox mounts")
	assert.True(t, isMounted(t, sb.Mountpoint))

	// Mounted again, it takes changes and commits.
	writeFile(t, filepath.Join(sb.Mountpoint, "later"), "later\n")
	r = e.sbxfs("commit", sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "kept"), "kept\n")
	assertFile(t, filepath.Join(o, "later"), "later\n")
	assert.False(t, isMounted(t, sb.Mountpoint))

	assertFailure(t, e.sbxfs("mount", sb.ID), exitState, "not active")
	assert.False(t, isMounted(t, sb.Mountpoint))
	assertFailure(t, e.sbxfs("mount", "0123456789abcdef"), exitNotSbxfs, "no sandbox 0123456789abcdef")
}

// A sandbox created at a MOUNTPOINT of its own is found by that path; a
// stopped daemon is started and has mounted it (exit 0, not "already
// mounted"); the standalone flags and paths no managed sandbox uses are
// refused.
func TestManagedMountAgainByMountpoint(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	mnt := filepath.Join(e.base, "here")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	cleanupMount(t, mnt) // outside the state root: the env's cleanup does not look there
	sb := e.create(o, mnt)
	assert.Equal(t, mnt, sb.Mountpoint)
	writeFile(t, filepath.Join(mnt, "kept"), "kept\n")

	require.Equal(t, 0, e.sbxfs("unmount", mnt).code)
	r := e.sbxfs("mount", mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(mnt, "kept"), "kept\n")

	r = e.sbxfs("daemon", "stop")
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, mnt))
	r = e.sbxfs("mount", sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stderr, "started the daemon")
	assert.Equal(t, sb.ID+"\t"+mnt+"\n", r.stdout)
	assert.True(t, isMounted(t, mnt))
	assertFile(t, filepath.Join(mnt, "kept"), "kept\n")

	assertFailure(t, e.sbxfs("mount", "--upper", filepath.Join(e.base, "u"), sb.ID), exitUsage, "--upper is for a standalone mount")
	assertFailure(t, e.sbxfs("mount", "--foreground", sb.ID), exitUsage, "standalone")
	plain := filepath.Join(e.base, "plain")
	require.NoError(t, os.Mkdir(plain, 0o755))
	assertFailure(t, e.sbxfs("mount", plain), exitUsage, "not the mountpoint of a managed sandbox")
	assertFailure(t, e.sbxfs("mount", filepath.Join(e.base, "missing")), exitBadPath, "does not exist")
	assert.True(t, isMounted(t, mnt), "the refusals left the sandbox mounted")
}

// Nested sandboxes mount again parents first: the child of an unmounted
// parent exits 4 saying to mount the parent first; then parent and child
// mount, the child shows both sets of changes, and the plan commits.
func TestManagedNestedMountAgain(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	n := e.nested()
	require.Equal(t, 0, e.sbxfs("unmount", n.b.Mountpoint).code)
	require.Equal(t, 0, e.sbxfs("unmount", n.a.Mountpoint).code)
	assert.False(t, isMounted(t, n.a.Mountpoint))
	assert.False(t, isMounted(t, n.b.Mountpoint))

	r := e.sbxfs("mount", n.b.ID)
	assertFailure(t, r, exitBusy, "mount sandbox "+n.a.ID+" first")
	assert.Contains(t, r.stderr, "not mounted")
	assert.False(t, isMounted(t, n.b.Mountpoint))

	r = e.sbxfs("mount", n.a.ID)
	require.Equal(t, 0, r.code, r.stderr)
	r = e.sbxfs("mount", n.b.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	assert.True(t, isMounted(t, n.a.Mountpoint))
	assert.True(t, isMounted(t, n.b.Mountpoint))
	n.assertAllNew(t, n.b.Mountpoint)
	assertFile(t, filepath.Join(n.a.Mountpoint, "b.txt"), "base\n")
	l := e.list()
	assert.True(t, l[n.a.ID].Mounted)
	assert.True(t, l[n.b.ID].Mounted)

	r = e.sbxfs("commit", "--plan", "p")
	require.Equal(t, 0, r.code, r.stderr)
	n.assertAllNew(t, n.orig)
}

// TestManagedOriginalMovedAway: with its original moved away, a managed
// sandbox neither mounts again nor commits (exit 3: put it back, or
// record its new place); nothing is lost, and once the original is back
// both work.
func TestManagedOriginalMovedAway(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	sb := e.create(o)
	writeFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	r := e.sbxfs("unmount", sb.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, os.Rename(o, o+".away"))

	for _, cmd := range []string{"mount", "commit"} {
		r = e.sbxfs(cmd, sb.ID)
		assertFailure(t, r, exitBadPath, "the sandbox's original is missing: "+o+" is not there (moved or removed?): put it back there and retry")
		assert.Contains(t, r.stderr, "if it was moved, record its new place with 'sbxfs mount --moved NEWPLACE ID'")
	}
	assert.Equal(t, manager.Active, e.list()[sb.ID].State)

	require.NoError(t, os.Rename(o+".away", o))
	r = e.sbxfs("mount", sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	r = e.sbxfs("commit", sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o, "kept"), "kept\n")
}

// TestManagedMovedOriginal: 'sbxfs mount --moved NEWPLACE ID' records
// where a managed sandbox's original was moved and mounts the sandbox
// over it: the changes show there, status works, and the commit lands at
// the new place, nothing at the old one. Refused while the sandbox is
// mounted and while the old place is still a directory (exit 4, exit 3):
// the record stays as it was.
func TestManagedMovedOriginal(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	other := e.original("other")
	sb := e.create(o)
	writeFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")

	r := e.sbxfs("mount", "--moved", other, sb.ID)
	assertFailure(t, r, exitBusy, "is mounted")
	r = e.sbxfs("unmount", sb.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	r = e.sbxfs("mount", "--moved", other, sb.ID)
	assertFailure(t, r, exitBadPath, o+" is still there")
	r = e.sbxfs("mount", "--moved", "--foreground", other, sb.ID)
	assertFailure(t, r, exitUsage, "--foreground is for a standalone mount")
	r = e.sbxfs("mount", "--moved", sb.ID)
	assertFailure(t, r, exitUsage, "'sbxfs mount --moved NEWPLACE ID'")

	moved := o + ".moved"
	require.NoError(t, os.Rename(o, moved))
	r = e.sbxfs("mount", "--moved", moved, sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, sb.ID+"\t"+sb.Mountpoint+"\t"+moved+"\n", r.stdout)
	assert.True(t, isMounted(t, sb.Mountpoint))
	assertFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	assertFile(t, filepath.Join(sb.Mountpoint, "a.txt"), "hello\n")
	assert.Equal(t, moved, e.list()[sb.ID].Original)
	r = e.sbxfs("status", sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "A kept")

	r = e.sbxfs("commit", sb.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(moved, "kept"), "kept\n")
	_, err := os.Lstat(o)
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing made at the old place")
}
