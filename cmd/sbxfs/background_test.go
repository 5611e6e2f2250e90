package main

import (
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeServer starts sh -c script with the write end of a ready pipe as fd
// 3, as startBackground starts the real server, and returns what
// awaitReady makes of it.
func fakeServer(t *testing.T, script, logPath string) error {
	t.Helper()
	rd, wr, err := os.Pipe()
	require.NoError(t, err)
	defer rd.Close()
	cmd := exec.Command("sh", "-c", script)
	cmd.ExtraFiles = []*os.File{wr}
	require.NoError(t, cmd.Start())
	wr.Close()
	return awaitReady(cmd, rd, serverOutput{path: logPath})
}

func TestAwaitReady(t *testing.T) {
	t.Parallel()
	log := filepath.Join(t.TempDir(), "server.log")

	assert.NoError(t, fakeServer(t, "echo ok >&3", log))

	err := fakeServer(t, `echo "error 4 sandbox /s is already served by process 7; unmount it" >&3; exit 4`, log)
	require.Error(t, err)
	assert.Equal(t, exitBusy, exitCode(err))
	assert.Equal(t, "sandbox /s is already served by process 7; unmount it", err.Error())

	err = fakeServer(t, `echo "fusermount3: no access" >> `+log+`; echo "sbxfs: mount failed" >> `+log+`; echo "error 5 mount failed; see" >&3`, log)
	require.Error(t, err)
	assert.Equal(t, exitMountFailed, exitCode(err))
	assert.Equal(t, "mount failed; see\nserver output:\n  fusermount3: no access", err.Error())

	err = fakeServer(t, `echo "error x garbled" >&3`, log)
	require.Error(t, err)
	assert.Equal(t, exitInternal, exitCode(err))

	err = fakeServer(t, `printf 'line 1\nfatal: boom\n' >> `+log+`; exit 7`, log)
	require.Error(t, err)
	assert.Equal(t, exitMountFailed, exitCode(err))
	assert.Contains(t, err.Error(), "exited before the mount was live")
	assert.Contains(t, err.Error(), "fatal: boom")
	assert.Contains(t, err.Error(), log)
}

func TestReadyPipeFailIsOneLine(t *testing.T) {
	t.Parallel()
	rd, wr, err := os.Pipe()
	require.NoError(t, err)
	defer rd.Close()
	r := &readyPipe{f: wr}
	r.fail(exitBadPath, "first\nsecond  third")
	r.ok() // ignored: one report only
	b := make([]byte, 100)
	n, _ := rd.Read(b)
	assert.Equal(t, "error 3 first second third\n", string(b[:n]))
	var none *readyPipe
	none.ok() // no pipe: nothing happens
}

func TestStatusNonUTF8Path(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)
	require.Equal(t, 0, runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt).code)
	name := "bad\xffname\nline"
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, name), nil, 0o644))
	st := statusOf(t, f.mnt)
	var found bool
	for _, c := range st.Changes {
		if c.PathB64 != "" {
			p, err := base64.StdEncoding.DecodeString(c.PathB64)
			require.NoError(t, err)
			found = found || string(p) == name
		}
	}
	assert.True(t, found, "path_b64 gives the exact name: %+v", st.Changes)
	r := runBin(t, bin, "status", f.mnt)
	assert.Contains(t, r.stdout, `A "bad\xffname\nline"`+"\n")
	require.Equal(t, 0, runBin(t, bin, "unmount", f.mnt).code)
}
