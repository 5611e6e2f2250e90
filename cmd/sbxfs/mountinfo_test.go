package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
)

func TestSbxfsMountOf(t *testing.T) {
	t.Parallel()
	me, other := os.Geteuid(), os.Geteuid()+4242
	es, err := fsutil.ParseMountinfo(strings.NewReader(fmt.Sprintf(`22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:41 / /tmp/with\040space rw,nosuid,nodev - fuse.sbxfs /var/lib/sbxfs/mounts/ab\040cd/work rw,user_id=%d,group_id=0
37 22 0:42 / /tmp/other rw - fuse.other /w rw,user_id=%d,group_id=0
38 22 0:43 / /tmp/s rw - fuse.sbxfs /w rw,user_id=%d,group_id=0
39 22 0:44 / /tmp/theirs rw - fuse.sbxfs /x rw,user_id=%d,group_id=0
40 22 0:45 / /tmp/mine rw - fuse.sbxfs /x rw,user_id=%d,group_id=0
`, me, me, me, other, me)))
	require.NoError(t, err)
	assert.True(t, isSbxfs(&es[1]))
	assert.False(t, isSbxfs(&es[2]))
	assert.Equal(t, 36, sbxfsMountOf(es, "/var/lib/sbxfs/mounts/ab cd/work").ID)
	assert.Equal(t, 38, sbxfsMountOf(es, "/w").ID, "only sbxfs mounts")
	assert.Nil(t, sbxfsMountOf(es, "/dev/sda1"))
	assert.False(t, isSbxfs(&es[4]), "another user's mount of type fuse.sbxfs")
	assert.Equal(t, 40, sbxfsMountOf(es, "/x").ID, "only the caller's own mounts")
	assert.Contains(t, othersSbxfs(&es[4]), fmt.Sprintf("another user (uid %d)", other))
	assert.Empty(t, othersSbxfs(&es[5]))
}

// TestAnotherUsersSandboxDirectory: a sandbox directory whose work
// directory belongs to another user is refused by every command that
// reads it (its record would say which original a commit writes); a
// chown of the mount's root, which the upper's root takes, changes
// nothing (the upper's owner says nothing of whose the sandbox is).
func TestAnotherUsersSandboxDirectory(t *testing.T) {
	requireFuse(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the sandbox to another user")
	}
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)
	require.Equal(t, 0, runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt).code)
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "new"), []byte("n"), 0o644))
	require.NoError(t, os.Chown(f.mnt, 65534, 65534))
	r := runBin(t, bin, "status", f.mnt)
	require.Equal(t, 0, r.code, "the upper's root takes the mount root's owner: %s", r.stderr)
	require.Equal(t, 0, runBin(t, bin, "unmount", f.mnt).code)
	require.NoError(t, os.Chown(filepath.Join(f.dir, "work"), 65534, 65534))
	for _, cmd := range [][]string{{"status", f.dir}, {"diff", f.dir}, {"commit", f.dir}, {"rollback", f.dir}} {
		assertFailure(t, runBin(t, bin, cmd...), exitNotSbxfs, "belongs to uid 65534, not to you")
	}
	assert.FileExists(t, filepath.Join(f.dir, "upper", "new"), "refused, the sandbox keeps its changes")
	assert.NoFileExists(t, filepath.Join(f.orig, "new"))
}
