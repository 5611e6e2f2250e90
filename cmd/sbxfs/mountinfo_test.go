package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
)

func TestSbxfsMountOf(t *testing.T) {
	t.Parallel()
	es, err := fsutil.ParseMountinfo(strings.NewReader(`22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:41 / /tmp/with\040space rw,nosuid,nodev - fuse.sbxfs /var/lib/sbxfs/mounts/ab\040cd/work rw
37 22 0:42 / /tmp/other rw - fuse.other /w rw
38 22 0:43 / /tmp/s rw - fuse.sbxfs /w rw
`))
	require.NoError(t, err)
	assert.True(t, isSbxfs(&es[1]))
	assert.False(t, isSbxfs(&es[2]))
	assert.Equal(t, 36, sbxfsMountOf(es, "/var/lib/sbxfs/mounts/ab cd/work").ID)
	assert.Equal(t, 38, sbxfsMountOf(es, "/w").ID, "only sbxfs mounts")
	assert.Nil(t, sbxfsMountOf(es, "/dev/sda1"))
}
