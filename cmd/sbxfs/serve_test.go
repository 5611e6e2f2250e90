package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// holdPidFile starts a process that writes its pid into work's pid file
// and holds the file's lock for d, as a server does while it serves.
func holdPidFile(t *testing.T, work string, d time.Duration) *exec.Cmd {
	t.Helper()
	path := filepath.Join(work, pidFileName)
	secs := strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
	cmd := exec.Command("sh", "-c", `echo $$ > "$1"; exec flock -o "$1" sleep "$2"`, "sh", path, secs)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		return unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil
	}, 5*time.Second, time.Millisecond, "the helper holds the pid file's lock")
	return cmd
}

// waitServerExit returns once the process holding the pid file exits, and
// gives its pid when it is still there at the timeout.
func TestWaitServerExit(t *testing.T) {
	t.Parallel()
	_, err := exec.LookPath("flock")
	require.NoError(t, err, "flock(1), from util-linux")
	work := t.TempDir()
	holdPidFile(t, work, 300*time.Millisecond)
	start := time.Now()
	assert.Zero(t, waitServerExit(work, 5*time.Second), "the server exited")
	took := time.Since(start)
	assert.Greater(t, took, 100*time.Millisecond, "it waited for the exit")
	assert.Less(t, took, 4*time.Second, "it returned when the server exited, not at the timeout")

	work = t.TempDir()
	holder := holdPidFile(t, work, 10*time.Second)
	assert.Equal(t, holder.Process.Pid, waitServerExit(work, 100*time.Millisecond), "still serving at the timeout")
}
