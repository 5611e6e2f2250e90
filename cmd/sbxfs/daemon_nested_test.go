package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/manager"
)

// nested is a sandbox A of an original and a sandbox B of A's mountpoint,
// both in plan p and served by the one daemon (which then reads its own
// mount), each changed through its mount: A changes a.txt and adds fromA,
// B changes b.txt, adds fromB and dirB/x and removes gone.
type nested struct {
	orig string
	a, b manager.SandboxInfo
}

func (e *managedEnv) nested() nested {
	e.t.Helper()
	t := e.t
	orig := e.original("o")
	writeFile(t, filepath.Join(orig, "b.txt"), "base\n")
	writeFile(t, filepath.Join(orig, "gone"), "bye\n")
	a := e.create("--plan", "p", "--name", "parent", orig)
	b := e.create("--plan", "p", "--name", "child", a.Mountpoint)
	assert.Equal(t, a.Mountpoint, b.Original)

	writeFile(t, filepath.Join(a.Mountpoint, "a.txt"), "A\n")
	writeFile(t, filepath.Join(a.Mountpoint, "fromA"), "A\n")
	writeFile(t, filepath.Join(b.Mountpoint, "b.txt"), "B\n")
	writeFile(t, filepath.Join(b.Mountpoint, "fromB"), "B\n")
	require.NoError(t, os.Mkdir(filepath.Join(b.Mountpoint, "dirB"), 0o755))
	writeFile(t, filepath.Join(b.Mountpoint, "dirB", "x"), "x\n")
	require.NoError(t, os.Remove(filepath.Join(b.Mountpoint, "gone")))
	assertFile(t, filepath.Join(a.Mountpoint, "gone"), "bye\n")
	// A's changes show in A and through B; B's only in B.
	assertFile(t, filepath.Join(b.Mountpoint, "a.txt"), "A\n")
	assertFile(t, filepath.Join(b.Mountpoint, "fromA"), "A\n")
	assertFile(t, filepath.Join(a.Mountpoint, "b.txt"), "base\n")
	assert.NoFileExists(t, filepath.Join(a.Mountpoint, "fromB"))
	assertFile(t, filepath.Join(orig, "a.txt"), "hello\n")
	assert.NoFileExists(t, filepath.Join(orig, "fromA"))
	return nested{orig: orig, a: a, b: b}
}

// names lists dir's entries.
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

var nestedNames = []string{"a.txt", "b.txt", "dirB", "fromA", "fromB"}

func (n nested) assertAllNew(t *testing.T, dir string) {
	t.Helper()
	assert.Equal(t, nestedNames, names(t, dir), "%s: both sets of changes and nothing else (no transaction directory)", dir)
	assertFile(t, filepath.Join(dir, "a.txt"), "A\n")
	assertFile(t, filepath.Join(dir, "b.txt"), "B\n")
	assertFile(t, filepath.Join(dir, "fromA"), "A\n")
	assertFile(t, filepath.Join(dir, "fromB"), "B\n")
	assertFile(t, filepath.Join(dir, "dirB", "x"), "x\n")
}

func (n nested) assertAllOld(t *testing.T) {
	t.Helper()
	assert.Equal(t, []string{"a.txt", "b.txt", "gone"}, names(t, n.orig), "the original is unchanged")
	assertFile(t, filepath.Join(n.orig, "a.txt"), "hello\n")
	assertFile(t, filepath.Join(n.orig, "b.txt"), "base\n")
}

// commit --plan of a parent and a sandbox nested in it, both mounted by
// the daemon: the child is committed into the parent's mount first, the
// parent then brings both to the original.
func TestManagedNestedPlanCommit(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	n := e.nested()
	r := e.sbxfs("commit", "--plan", "p", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var res planJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, []string{n.b.ID, n.a.ID}, res.Committed, "children before parents")
	n.assertAllNew(t, n.orig)
	l := e.list()
	for _, sb := range []manager.SandboxInfo{n.a, n.b} {
		assert.Equal(t, manager.Committed, l[sb.ID].State)
		assert.False(t, isMounted(t, sb.Mountpoint))
	}
}

// commit --plan --keep leaves both mounted and empty, showing the new
// original; rollback --plan then goes top-down (the child mounted on top
// first) and discards the new work of both.
func TestManagedNestedPlanKeepAndRollback(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	n := e.nested()
	r := e.sbxfs("commit", "--plan", "p", "--keep", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var res planJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, []string{n.b.ID, n.a.ID}, res.Committed)
	n.assertAllNew(t, n.orig)
	for _, sb := range []manager.SandboxInfo{n.a, n.b} {
		assert.True(t, isMounted(t, sb.Mountpoint))
		n.assertAllNew(t, sb.Mountpoint)
		assert.Empty(t, names(t, sb.Upper), "kept sandboxes are reset")
		assert.Equal(t, manager.Active, e.list()[sb.ID].State)
	}

	// The parent cannot be unmounted, nor ended alone, under its child:
	// its child's original would go away.
	for _, args := range [][]string{{"unmount", n.a.Mountpoint}, {"commit", n.a.ID}, {"rollback", n.a.ID}, {"destroy", n.a.ID}} {
		r = e.sbxfs(args...)
		assertFailure(t, r, exitBusy, n.b.ID)
	}
	for _, sb := range []manager.SandboxInfo{n.a, n.b} {
		assert.True(t, isMounted(t, sb.Mountpoint))
		assert.Equal(t, manager.Active, e.list()[sb.ID].State)
	}

	writeFile(t, filepath.Join(n.a.Mountpoint, "later-a"), "a\n")
	writeFile(t, filepath.Join(n.b.Mountpoint, "later-b"), "b\n")
	assertFile(t, filepath.Join(n.b.Mountpoint, "later-a"), "a\n")

	// A stopped daemon unmounts both (the child first); the next one mounts
	// them again, the parent first, so the child shows the parent's view.
	r = e.sbxfs("daemon", "stop")
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, n.a.Mountpoint))
	assert.False(t, isMounted(t, n.b.Mountpoint))
	l := e.list()
	assert.True(t, l[n.a.ID].Mounted)
	assert.True(t, l[n.b.ID].Mounted)
	assertFile(t, filepath.Join(n.b.Mountpoint, "later-a"), "a\n")
	assertFile(t, filepath.Join(n.b.Mountpoint, "later-b"), "b\n")
	assert.NoFileExists(t, filepath.Join(n.a.Mountpoint, "later-b"))

	r = e.sbxfs("rollback", "--plan", "p", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var br batchJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &br), r.stdout)
	assert.Equal(t, []string{n.b.ID, n.a.ID}, br.Done, "top-down: the child first")
	n.assertAllNew(t, n.orig)
	for _, sb := range []manager.SandboxInfo{n.a, n.b} {
		assert.False(t, isMounted(t, sb.Mountpoint))
		assert.Equal(t, manager.RolledBack, e.list()[sb.ID].State)
	}
}

// A conflict in the parent after the child was committed into it: the
// original is unchanged, the child is reported committed (into its
// parent), the parent stays active and mounted holding both sets of
// changes, and the plan commits once the conflict is resolved.
func TestManagedNestedParentConflict(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	n := e.nested()
	writeFile(t, filepath.Join(n.orig, "a.txt"), "theirs\n") // under A's change

	r := e.sbxfs("commit", "--plan", "p", "--json")
	assertFailure(t, r, exitConflict, "a.txt")
	var res planJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, []string{n.b.ID}, res.Committed, "the child is committed into its parent")
	assert.Equal(t, []string{n.a.ID}, res.RolledBack)
	assert.Equal(t, []string{"a.txt", "b.txt", "gone"}, names(t, n.orig), "no original was changed")
	assertFile(t, filepath.Join(n.orig, "a.txt"), "theirs\n")
	assertFile(t, filepath.Join(n.orig, "b.txt"), "base\n")
	l := e.list()
	assert.Equal(t, manager.Committed, l[n.b.ID].State)
	assert.Equal(t, manager.Active, l[n.a.ID].State)
	assert.True(t, l[n.a.ID].Mounted)
	n.assertAllNew(t, n.a.Mountpoint)

	r = e.sbxfs("commit", "--plan", "p", "--force")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "committed "+n.a.ID+"\n", r.stdout)
	n.assertAllNew(t, n.orig)
}

// sbxfs unmount of a managed sandbox's mount goes through the daemon: the
// sandbox stays active with its changes, list shows it unmounted, commit
// works on it unmounted, and the next daemon mounts it again.
func TestManagedUnmount(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o1, o2 := e.original("o1"), e.original("o2")
	s1, s2 := e.create(o1), e.create(o2)
	writeFile(t, filepath.Join(s1.Mountpoint, "kept"), "kept\n")
	writeFile(t, filepath.Join(s2.Mountpoint, "kept"), "kept 2\n")
	pid := e.daemonPid()

	open, err := os.Open(filepath.Join(s1.Mountpoint, "kept"))
	require.NoError(t, err)
	r := e.sbxfs("unmount", s1.Mountpoint)
	assertFailure(t, r, exitBusy, "use --lazy")
	assert.True(t, isMounted(t, s1.Mountpoint))
	require.NoError(t, open.Close())

	r = e.sbxfs("unmount", s1.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, s1.Mountpoint))
	assert.Equal(t, pid, e.daemonPid(), "the same daemon")
	l := e.list()
	assert.Equal(t, manager.Active, l[s1.ID].State, "the sandbox stays active")
	assert.False(t, l[s1.ID].Mounted, "and the daemon knows it is unmounted")
	assert.True(t, l[s2.ID].Mounted)
	assertFile(t, filepath.Join(s1.Upper, "kept"), "kept\n")
	assertFailure(t, e.sbxfs("unmount", s1.Mountpoint), exitNotSbxfs, "not a mount point")

	// --lazy detaches a busy mount at once.
	open, err = os.Open(filepath.Join(s2.Mountpoint, "kept"))
	require.NoError(t, err)
	r = e.sbxfs("unmount", "--lazy", s2.Mountpoint)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, s2.Mountpoint))
	b := make([]byte, 4)
	_, err = open.Read(b)
	assert.NoError(t, err, "an open file still works after a lazy unmount")
	require.NoError(t, open.Close())

	// The next daemon mounts both again.
	r = e.sbxfs("daemon", "stop")
	require.Equal(t, 0, r.code, r.stderr)
	l = e.list()
	assert.True(t, l[s1.ID].Mounted)
	assert.True(t, isMounted(t, s1.Mountpoint))
	assertFile(t, filepath.Join(s1.Mountpoint, "kept"), "kept\n")
	assertFile(t, filepath.Join(s2.Mountpoint, "kept"), "kept 2\n")

	// Unmounted, it still commits.
	require.Equal(t, 0, e.sbxfs("unmount", s1.Mountpoint).code)
	r = e.sbxfs("commit", s1.ID)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(o1, "kept"), "kept\n")
	assert.Equal(t, manager.Committed, e.list()[s1.ID].State)
}

// daemon status and daemon stop, with and without a daemon, as text and
// JSON; neither starts a daemon.
func TestDaemonStopAndStatus(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	for _, args := range [][]string{{"daemon", "status"}, {"daemon", "stop"}} {
		r := e.sbxfs(args...)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, "no daemon serves "+e.root+"\n", r.stdout)
	}
	var st daemonJSON
	r := e.sbxfs("daemon", "status", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	assert.Equal(t, daemonJSON{StateRoot: e.root}, st)
	assert.Zero(t, e.daemonPid(), "status and stop start no daemon")
	assertFailure(t, e.sbxfs("daemon", "stop", "x"), exitUsage, "no arguments")

	o := e.original("o")
	sb := e.create(o)
	e.create(o)
	writeFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	pid := e.daemonPid()
	r = e.sbxfs("daemon", "status", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	st = daemonJSON{}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	assert.True(t, st.Running)
	assert.Equal(t, pid, st.Pid)
	require.NotNil(t, st.Sandboxes)
	assert.Equal(t, 2, *st.Sandboxes)
	assert.Equal(t, 2, *st.Active)
	assert.Equal(t, 2, *st.Mounted)
	r = e.sbxfs("daemon", "status")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "2 sandboxes (2 active, 2 mounted)")

	r = e.sbxfs("daemon", "stop", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	st = daemonJSON{}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	require.NotNil(t, st.Stopped)
	assert.True(t, *st.Stopped)
	assert.False(t, st.Running)
	assert.Equal(t, pid, st.Pid)
	assert.False(t, processAlive(pid), "stop returns once the daemon has exited")
	assert.False(t, isMounted(t, sb.Mountpoint), "a stopped daemon unmounts")
	assert.NoFileExists(t, filepath.Join(e.root, manager.DaemonSocket))

	r = e.sbxfs("daemon", "stop", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	st = daemonJSON{}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	require.NotNil(t, st.Stopped)
	assert.False(t, *st.Stopped, "nothing to stop")

	l := e.list() // a new daemon mounts the sandboxes again
	assert.True(t, l[sb.ID].Mounted)
	assertFile(t, filepath.Join(sb.Mountpoint, "kept"), "kept\n")
	r = e.sbxfs("daemon", "stop")
	require.Equal(t, 0, r.code, r.stderr)
	assert.True(t, strings.HasPrefix(r.stdout, "daemon of "+e.root+" stopped (pid "), r.stdout)
}
