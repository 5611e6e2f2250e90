package fsutil

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const sampleMountinfo = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
36 22 0:41 / /tmp/with\040space rw,nosuid,nodev,relatime shared:30 master:2 - fuse.sbxfs /var/lib/sbxfs/mounts/ab\040cd/work rw,user_id=0,group_id=0,default_permissions
37 22 0:42 / /tmp/tab\011nl\012back\134slash rw,nosuid,nodev - fuse.sbxfs /w rw
38 22 0:43 /sub /tmp/bind rw - ext4 /dev/sda1 rw
39 22 0:44 / /tmp/bind rw - tmpfs tmpfs rw

`

func TestParseMountinfo(t *testing.T) {
	t.Parallel()
	es, err := ParseMountinfo(strings.NewReader(sampleMountinfo))
	require.NoError(t, err)
	require.Len(t, es, 5)

	assert.Equal(t, MountEntry{ID: 22, Parent: 1, Dev: unix.Mkdev(8, 1), Root: "/", Mountpoint: "/", Options: "rw,relatime",
		FSType: "ext4", Source: "/dev/sda1", SuperOpts: "rw,errors=remount-ro"}, es[0])

	assert.Equal(t, "/tmp/with space", es[1].Mountpoint)
	assert.Equal(t, "/var/lib/sbxfs/mounts/ab cd/work", es[1].Source)
	assert.Equal(t, "fuse.sbxfs", es[1].FSType)
	assert.Equal(t, unix.Mkdev(0, 41), es[1].Dev)
	assert.Equal(t, "/tmp/tab\tnl\nback\\slash", es[2].Mountpoint)

	assert.Equal(t, 36, MountAt(es, "/tmp/with space").ID)
	assert.Equal(t, 39, MountAt(es, "/tmp/bind").ID, "the topmost of stacked mounts")
	assert.Nil(t, MountAt(es, "/tmp"))
}

func TestParseMountinfoMalformed(t *testing.T) {
	t.Parallel()
	for _, line := range []string{
		"22 1 8:1 / / rw - ext4",             // no source
		"22 1 8:1 / / rw shared:1 ext4 /dev", // no separator
		"x 1 8:1 / / rw - ext4 /dev/sda1 rw", // bad id
		"22 1 8 / / rw - ext4 /dev/sda1 rw",  // bad device number
	} {
		_, err := ParseMountinfo(strings.NewReader(line + "\n"))
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
	es, err := ReadMountinfo()
	require.NoError(t, err)
	root := MountAt(es, "/")
	require.NotNil(t, root, "the root is mounted")
	var st unix.Stat_t
	require.NoError(t, unix.Stat("/proc", &st))
	proc := MountAt(es, "/proc")
	require.NotNil(t, proc)
	assert.Equal(t, st.Dev, proc.Dev, "the device number is st_dev's")
}

func TestFuseConnDir(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "/sys/fs/fuse/connections/41", FuseConnDir(unix.Mkdev(0, 41)))
	assert.Equal(t, "/sys/fs/fuse/connections/8388609", FuseConnDir(unix.Mkdev(8, 1)), "major<<20 | minor")
}

func TestMountContaining(t *testing.T) {
	entries := []MountEntry{
		{Mountpoint: "/", FSType: "ext4"},
		{Mountpoint: "/a", FSType: "tmpfs"},
		{Mountpoint: "/a/b", FSType: "fuse.sbxfs"},
		{Mountpoint: "/a/b", FSType: "fuse.sbxfs", Source: "top"}, // mounted on top
		{Mountpoint: "/ab", FSType: "xfs"},
	}
	for _, tc := range []struct{ path, want, source string }{
		{"/", "/", ""},
		{"/x/y", "/", ""},
		{"/a", "/a", ""},
		{"/a/c", "/a", ""},
		{"/a/b", "/a/b", "top"},
		{"/a/b/c/d", "/a/b", "top"},
		{"/ab/c", "/ab", ""},
		{"/abc", "/", ""}, // not beneath /ab
	} {
		e := MountContaining(entries, tc.path)
		if assert.NotNil(t, e, tc.path) {
			assert.Equal(t, tc.want, e.Mountpoint, tc.path)
			assert.Equal(t, tc.source, e.Source, tc.path)
		}
	}
	assert.Nil(t, MountContaining(entries[1:], "/x"), "no mount holds it")
}

func TestFUSEUser(t *testing.T) {
	for _, tc := range []struct {
		opts string
		uid  uint32
		ok   bool
	}{
		{"rw,user_id=0,group_id=0,default_permissions", 0, true},
		{"rw,user_id=1000,group_id=1000", 1000, true},
		{"rw,errors=remount-ro", 0, false},
		{"rw,user_id=x", 0, false},
	} {
		e := MountEntry{SuperOpts: tc.opts}
		uid, ok := e.FUSEUser()
		if uid != tc.uid || ok != tc.ok {
			t.Errorf("FUSEUser of %q = %d, %v; want %d, %v", tc.opts, uid, ok, tc.uid, tc.ok)
		}
	}
	me := MountEntry{SuperOpts: fmt.Sprintf("rw,user_id=%d,group_id=0", os.Geteuid())}
	other := MountEntry{SuperOpts: fmt.Sprintf("rw,user_id=%d,group_id=0", os.Geteuid()+4242)}
	if !me.MountedByMe() || other.MountedByMe() || (&MountEntry{}).MountedByMe() {
		t.Errorf("MountedByMe: mine %v, another user's %v, no user_id %v; want true, false, false",
			me.MountedByMe(), other.MountedByMe(), (&MountEntry{}).MountedByMe())
	}
}
