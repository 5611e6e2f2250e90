package manager

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
)

// nestedPair is a testdaemon serving sandbox A of an original and
// sandbox B of A's mountpoint, both in plan "p", each changed through its
// mount: A changes a.txt and adds fromA, B changes b.txt and adds fromB.
type nestedPair struct {
	d          *daemon
	root, orig string
	a, b       string // ids
	aMnt, bMnt string
}

func startNested(t *testing.T) *nestedPair {
	t.Helper()
	var extra []string // B's mountpoint, detached after the daemon stopped
	t.Cleanup(func() {
		for _, mnt := range extra {
			if fsutil.IsStaleMount(mnt) || mounted(mnt) {
				t.Errorf("%s is still mounted after the daemon stopped", mnt)
				_ = lazyDetach(mnt)
			}
		}
	})
	root := t.TempDir()
	orig := makeTree(t, map[string]string{"a.txt": "a\n", "b.txt": "b\n", "sub/keep": "k"})
	d := startDaemon(t, root, orig)
	d.send("create " + d.mnt)
	f := strings.Fields(d.next("CREATED"))
	require.Len(t, f, 3)
	np := &nestedPair{d: d, root: root, orig: orig, a: d.id, aMnt: d.mnt, b: f[1], bMnt: f[2]}
	extra = append(extra, np.bMnt)

	write := func(dir, name, data string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644))
	}
	write(np.aMnt, "a.txt", "A\n")
	write(np.aMnt, "fromA", "A\n")
	write(np.bMnt, "b.txt", "B\n")
	write(np.bMnt, "fromB", "B\n")
	// A's changes show through B; B's stay in B.
	assert.Equal(t, "A\n", readFile(t, np.bMnt, "a.txt"))
	assert.Equal(t, "A\n", readFile(t, np.bMnt, "fromA"))
	assert.Equal(t, "b\n", readFile(t, np.aMnt, "b.txt"))
	assert.NoFileExists(t, filepath.Join(np.aMnt, "fromB"))
	assert.NoFileExists(t, filepath.Join(orig, "fromA"))
	return np
}

// every original file after both commits.
var nestedAllNew = map[string]string{".": "dir", "a.txt": "A\n", "b.txt": "B\n", "fromA": "A\n", "fromB": "B\n", "sub": "dir", "sub/keep": "k"}

// A sandbox nested in another (its original is the other's mount) is
// served by the same process as its parent, which reads its parent's
// mount: the plan commits the child into the parent's mount first, then
// the parent brings both sets of changes to the original, with no
// deadlock and nothing of the commit's own (its transaction directory)
// left in the original.
func TestNestedMountedPlanCommit(t *testing.T) {
	np := startNested(t)
	np.d.send("commit")
	a := np.d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, []string{np.b, np.a}, a.Result.Committed, "the child first")
	assert.Equal(t, nestedAllNew, snapshot(t, np.orig))
	assert.False(t, mounted(np.bMnt))
	assert.False(t, mounted(np.aMnt))
}

// With keep both stay mounted and empty, showing the new original; a
// rollback of the plan then goes child first and leaves the original.
func TestNestedMountedPlanKeepThenRollback(t *testing.T) {
	np := startNested(t)
	np.d.send("commit keep")
	a := np.d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, []string{np.b, np.a}, a.Result.Committed)
	assert.Equal(t, nestedAllNew, snapshot(t, np.orig))
	for _, mnt := range []string{np.aMnt, np.bMnt} {
		assert.True(t, mounted(mnt))
		assert.Equal(t, nestedAllNew, snapshot(t, mnt), "%s shows the new original", mnt)
	}
	for _, id := range []string{np.a, np.b} {
		ents, err := os.ReadDir(filepath.Join(np.root, "sandboxes", id, "upper"))
		require.NoError(t, err)
		assert.Empty(t, ents, "sandbox %s is reset", id)
	}

	require.NoError(t, os.WriteFile(filepath.Join(np.aMnt, "again"), []byte("a"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(np.bMnt, "again-b"), []byte("b"), 0o644))
	np.d.send("rollback")
	a = np.d.answer()
	require.Empty(t, a.Err)
	assert.Equal(t, []string{np.b, np.a}, a.Result.Done, "the child (mounted on top) first")
	assert.Equal(t, nestedAllNew, snapshot(t, np.orig))
	assert.False(t, mounted(np.bMnt))
	assert.False(t, mounted(np.aMnt))
}
