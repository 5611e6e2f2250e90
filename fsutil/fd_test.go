package fsutil

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestDupClosesOnExec: the copy has close-on-exec, as the descriptors Go
// opens have (dup(2)'s copy has not).
func TestDupClosesOnExec(t *testing.T) {
	f, err := os.Open(t.TempDir())
	require.NoError(t, err)
	defer f.Close()
	fd, err := Dup(int(f.Fd()))
	require.NoError(t, err)
	defer unix.Close(fd)
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.NoError(t, err)
	require.NotZero(t, flags&unix.FD_CLOEXEC)
}
