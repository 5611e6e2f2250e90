package fsutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil/fsutiltest"
)

// TestOrdersDataBeforeRename: only a journaled ext4 in data=ordered or
// data=journal mode counts; ext4 without a journal, data=writeback and
// tmpfs do not.
func TestOrdersDataBeforeRename(t *testing.T) {
	tests := []struct {
		name string
		opts string
		mkfs []string
		want bool
	}{
		{"journal, data=ordered (the default)", "rw", []string{"-O", "has_journal"}, true},
		{"journal, data=journal", "data=journal", []string{"-O", "has_journal"}, true},
		{"journal, data=writeback", "data=writeback", []string{"-O", "has_journal"}, false},
		{"no journal", "rw", []string{"-O", "^has_journal"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mnt := fsutiltest.MountExt4(t, tt.opts, tt.mkfs...)
			sub := filepath.Join(mnt, "work")
			require.NoError(t, os.Mkdir(sub, 0o700))
			assert.Equal(t, tt.want, OrdersDataBeforeRename(sub))
		})
	}
	t.Run("tmpfs", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to mount a tmpfs")
		}
		mnt := t.TempDir()
		require.NoError(t, unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"))
		t.Cleanup(func() { _ = unix.Unmount(mnt, 0) })
		assert.False(t, OrdersDataBeforeRename(mnt))
	})
	t.Run("missing", func(t *testing.T) {
		assert.False(t, OrdersDataBeforeRename(filepath.Join(t.TempDir(), "absent")))
	})
}

// TestStartWriteback: the data of the file starts on its way to disk
// (no dirty pages are left to start), and a bad descriptor is an error.
func TestStartWriteback(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Write(make([]byte, 1<<20))
	require.NoError(t, err)
	require.NoError(t, StartWriteback(int(f.Fd())))
	require.NoError(t, unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WAIT_AFTER))
	assert.ErrorIs(t, StartWriteback(-1), unix.EBADF)
}
