package tests

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// TestCutOffReachesItsOwnConnectionOnly: a mount's FUSE connection held
// before its unmount (fsutil.FuseConn) is cut off through what it holds,
// never by its device number, which the next FUSE mount gets once the
// unmounted file system is gone: CutOff after a new mount took that
// number leaves the new mount working. (By name, fsutil.CutOffFuse would
// find the new mount's connection there and abort it.)
func TestCutOffReachesItsOwnConnectionOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusectl's control files are root's")
	}
	orig := newOrig(t, map[string]string{"f": "f"})
	first := mountSandbox(t, orig)
	var st unix.Stat_t
	require.NoError(t, unix.Stat(first.mnt, &st))
	conn, err := fsutil.OpenFuseConn(st.Dev)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, first.stop())

	// The next mount gets the freed number (the kernel hands out the
	// lowest free one); mount until one does.
	var second *sandbox
	for i := 0; i < 20 && second == nil; i++ {
		sb := mountSandbox(t, orig)
		var st2 unix.Stat_t
		require.NoError(t, unix.Stat(sb.mnt, &st2))
		if st2.Dev == st.Dev {
			second = sb
			break
		}
		require.NoError(t, sb.stop())
	}
	if second == nil {
		t.Fatalf("no new mount got the device number %d:%d back in 20 tries", unix.Major(st.Dev), unix.Minor(st.Dev))
	}
	_, err = os.Stat(fsutil.FuseConnDir(st.Dev))
	require.NoError(t, err, "the new mount's connection has the old one's name")
	cut, err := conn.CutOff(50 * time.Millisecond)
	require.NoError(t, err)
	assert.False(t, cut, "the held connection is gone: nothing to cut off")
	assert.Equal(t, "f", mustRead(t, second.path("f")), "the new mount still answers")
}
