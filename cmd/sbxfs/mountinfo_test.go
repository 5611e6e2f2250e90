package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sampleMountinfo = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
36 22 0:41 / /tmp/with\040space rw,nosuid,nodev,relatime shared:30 master:2 - fuse.sbxfs /var/lib/sbxfs/mounts/ab\040cd/work rw,user_id=0,group_id=0,default_permissions
37 22 0:42 / /tmp/tab\011nl\012back\134slash rw,nosuid,nodev - fuse.sbxfs /w rw
38 22 0:43 /sub /tmp/bind rw - ext4 /dev/sda1 rw
39 22 0:44 / /tmp/bind rw - tmpfs tmpfs rw

`

func TestParseMountinfo(t *testing.T) {
	t.Parallel()
	es, err := parseMountinfo(strings.NewReader(sampleMountinfo))
	require.NoError(t, err)
	require.Len(t, es, 5)

	assert.Equal(t, mountEntry{ID: 22, Parent: 1, Root: "/", Mountpoint: "/", Options: "rw,relatime",
		FSType: "ext4", Source: "/dev/sda1", SuperOpts: "rw,errors=remount-ro"}, es[0])

	assert.Equal(t, "/tmp/with space", es[1].Mountpoint)
	assert.Equal(t, "/var/lib/sbxfs/mounts/ab cd/work", es[1].Source)
	assert.True(t, es[1].isSbxfs())
	assert.Equal(t, "/tmp/tab\tnl\nback\\slash", es[2].Mountpoint)
	assert.False(t, es[3].isSbxfs())

	assert.Equal(t, 36, mountAt(es, "/tmp/with space").ID)
	assert.Equal(t, 39, mountAt(es, "/tmp/bind").ID, "the topmost of stacked mounts")
	assert.Nil(t, mountAt(es, "/tmp"))
	assert.Equal(t, 37, sbxfsMountOf(es, "/w").ID)
	assert.Nil(t, sbxfsMountOf(es, "/dev/sda1"))
}

func TestParseMountinfoMalformed(t *testing.T) {
	t.Parallel()
	for _, line := range []string{
		"22 1 8:1 / / rw - ext4",             // no source
		"22 1 8:1 / / rw shared:1 ext4 /dev", // no separator
		"x 1 8:1 / / rw - ext4 /dev/sda1 rw", // bad id
	} {
		_, err := parseMountinfo(strings.NewReader(line + "\n"))
		assert.Error(t, err, line)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		`plain`:       "plain",
		`a\040b`:      "a b",
		`\134`:        `\`,
		`trailing\04`: `trailing\04`,
		`\999`:        `\999`,
		`\4001`:       `\4001`,
	}
	for in, want := range tests {
		assert.Equal(t, want, unescapeMountinfo(in), in)
	}
}

func TestReadMountinfoLive(t *testing.T) {
	t.Parallel()
	es, err := readMountinfo()
	require.NoError(t, err)
	assert.NotNil(t, mountAt(es, "/"), "the root is mounted")
}
