package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMountMovedOriginal: a sandbox whose original was moved (mv ORIG NEW)
// says so and how to go on; 'mount --moved --upper DIR NEW MNT' records
// the new place, after which status and commit work there with the
// sandbox's changes. An original copied instead of moved conflicts on
// every path the sandbox changed (the bases are the old objects'), and a
// recorded place that still holds a directory is another original, not
// a moved one: refused. (Before, the sandbox could only be used again by
// moving the original back.)
func TestMountMovedOriginal(t *testing.T) {
	t.Parallel()
	bin, f := mountedFixture(t)
	writeFile(t, filepath.Join(f.mnt, "a.txt"), "changed\n")
	writeFile(t, filepath.Join(f.mnt, "sub", "new.txt"), "new\n")
	r := runBin(t, bin, "unmount", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)

	moved := f.orig + "-moved"
	require.NoError(t, os.Rename(f.orig, moved))
	assertFailure(t, runBin(t, bin, "status", f.dir), exitBadPath, "'sbxfs mount --moved --upper "+f.dir+" NEWPLACE MOUNTPOINT'")
	assertFailure(t, runBin(t, bin, "commit", f.dir), exitBadPath, "is missing (moved or removed?)")
	assertFailure(t, runBin(t, bin, "mount", "--upper", f.dir, moved, f.mnt), exitBadPath, "if the original was moved to "+moved+", mount with --moved")
	assertFailure(t, runBin(t, bin, "mount", "--moved", moved, f.mnt), exitUsage, "names no managed sandbox")
	assertFailure(t, runBin(t, bin, "mount", "--moved", moved, f.mnt), exitUsage, "--moved names the sandbox with --upper DIR")
	nowhere := filepath.Join(filepath.Dir(f.dir), "nowhere")
	assertFailure(t, runBin(t, bin, "mount", "--moved", "--upper", nowhere, moved, f.mnt), exitNotSbxfs, "--moved: no sandbox at "+nowhere)
	assert.NoDirExists(t, nowhere, "a wrong --upper is not made")

	r = runBin(t, bin, "mount", "--moved", "--upper", f.dir, moved, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(f.mnt, "a.txt"), "changed\n")
	r = runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "M a.txt\nA sub/new.txt\n2 changes: 1 created, 1 modified\n", r.stdout)
	r = runBin(t, bin, "commit", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assertFile(t, filepath.Join(moved, "a.txt"), "changed\n")
	assertFile(t, filepath.Join(moved, "sub", "new.txt"), "new\n")
	assert.NoDirExists(t, f.orig, "nothing was written at the old place")

	t.Run("copied, not moved", func(t *testing.T) {
		dir := filepath.Join(filepath.Dir(f.dir), "sandbox2")
		r := runBin(t, bin, "mount", "--upper", dir, moved, f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		writeFile(t, filepath.Join(f.mnt, "a.txt"), "again\n")
		require.Equal(t, 0, runBin(t, bin, "unmount", f.mnt).code)
		copied := f.orig + "-copied"
		out, err := exec.Command("cp", "-a", moved, copied).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assertFailure(t, runBin(t, bin, "mount", "--moved", "--upper", dir, copied, f.mnt), exitBadPath,
			"was not moved to "+copied+"; that is another original")
		require.NoError(t, os.RemoveAll(moved))

		r = runBin(t, bin, "mount", "--moved", "--upper", dir, copied, f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
		assertFailure(t, runBin(t, bin, "commit", f.mnt), exitConflict, "a.txt")
		assertFile(t, filepath.Join(copied, "a.txt"), "changed\n")
		r = runBin(t, bin, "rollback", f.mnt)
		require.Equal(t, 0, r.code, r.stderr)
	})
}
