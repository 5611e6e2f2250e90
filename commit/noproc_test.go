package commit

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// noProcEnv carries the sandbox's configuration to the copy of the test
// binary that runs without /proc.
const noProcEnv = "SBXFS_TEST_NOPROC_CFG"

// TestNoProcRefused runs the layers and the commit in a mount namespace
// whose /proc is unmounted: each refuses with fsutil.ErrNoProc (which says
// to mount /proc) instead of falling back to paths an original's symlink
// could redirect, and nothing is lost: back where /proc is, the same
// sandbox commits its change.
func TestNoProcRefused(t *testing.T) {
	if spec := os.Getenv(noProcEnv); spec != "" {
		noProcChild(t, spec)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("unshare -m needs root")
	}
	s := newSandbox(t, base)
	s.write("mod.txt", "sandbox")
	s.done()
	before := snapshot(t, s.orig)
	spec, err := json.Marshal(s.cfg)
	require.NoError(t, err)

	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`umount -l /proc && exec "$0" -test.run '^TestNoProcRefused$' -test.v`, os.Args[0])
	cmd.Env = append(os.Environ(), noProcEnv+"="+string(spec))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the run without /proc:\n%s", out)
	assert.Contains(t, string(out), "--- PASS: TestNoProcRefused", "the child ran the checks")

	assert.Equal(t, before, snapshot(t, s.orig), "the original is untouched")
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	got, err := os.ReadFile(filepath.Join(s.orig, "mod.txt"))
	require.NoError(t, err)
	assert.Equal(t, "sandbox", string(got), "the change was kept and commits where /proc is")
}

// noProcChild is TestNoProcRefused's side without /proc.
func noProcChild(t *testing.T, spec string) {
	_, err := os.Stat("/proc/self/fd")
	require.Error(t, err, "the child runs without /proc")
	var cfg layers.Config
	require.NoError(t, json.Unmarshal([]byte(spec), &cfg))

	_, err = layers.Open(cfg)
	assert.ErrorIs(t, err, fsutil.ErrNoProc, "layers.Open")
	_, err = layers.Changes(cfg)
	assert.ErrorIs(t, err, fsutil.ErrNoProc, "layers.Changes")
	_, err = layers.OpenLowerView(cfg)
	assert.ErrorIs(t, err, fsutil.ErrNoProc, "layers.OpenLowerView")
	_, err = Prepare(cfg, Options{})
	assert.ErrorIs(t, err, fsutil.ErrNoProc, "Prepare")
	_, err = Recover(cfg, RecoverOptions{})
	assert.ErrorIs(t, err, fsutil.ErrNoProc, "Recover")
	assert.Contains(t, fsutil.ErrNoProc.Error(), "mount -t proc proc /proc", "the error says what to do")
}
