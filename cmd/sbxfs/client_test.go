package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/manager"
)

func TestDaemonFailureExitCodes(t *testing.T) {
	plan := func(code string) error {
		res := &manager.PlanResult{Plan: "p", Err: &manager.DaemonError{Code: code, Msg: "m"}}
		return (*manager.PlanError)(res)
	}
	tests := []struct {
		err  error
		code int
	}{
		{&manager.DaemonError{Code: manager.CodeNotFound, Msg: "m"}, exitNotSbxfs},
		{&manager.DaemonError{Code: manager.CodeBusy, Msg: "m"}, exitBusy},
		{plan(manager.CodeConflict), exitConflict},
		{plan(manager.CodeChangedWhileRead), exitConflict},
		{plan(manager.CodeIllegalMove), exitState},
		{&manager.DaemonError{Code: manager.CodeInvalid, Msg: "m"}, exitBadPath},
		{plan(manager.CodeOriginalMissing), exitBadPath},
		{plan(manager.CodeOtherMount), exitBadPath},
		{plan(manager.CodeFailed), exitCommitFailed},
		{fmt.Errorf("x: %w", manager.ErrDaemonGone), exitInternal},
	}
	for _, tt := range tests {
		err := daemonFailure(tt.err, "/state", exitCommitFailed)
		assert.Equal(t, tt.code, exitCode(err), "%v", tt.err)
		assert.True(t, errors.Is(err, tt.err), "the cause stays matchable")
	}
	assert.NoError(t, daemonFailure(nil, "/state", exitInternal))
	assert.Contains(t, daemonFailure(plan(manager.CodeChangedWhileRead), "/state", exitCommitFailed).Error(), "commit again once it is still")
	assert.Contains(t, daemonFailure(plan(manager.CodeConflict), "/state", exitCommitFailed).Error(), "sbxfs resolve")
	assert.True(t, errors.Is(plan(manager.CodeOriginalMissing), manager.ErrOriginalMissing), "matched across the daemon socket")
}

// Usage errors of the managed commands, found before any daemon is
// needed: none is started.
func TestManagedCLIErrors(t *testing.T) {
	t.Parallel()
	bin := sbxfsBin(t)
	dir := realTempDir(t)
	root := filepath.Join(dir, "state")
	plain := filepath.Join(dir, "plain")
	require.NoError(t, os.Mkdir(plain, 0o755))
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"run without a command", []string{"run", dir}, exitUsage, "ORIGINAL -- CMD"},
		{"run without a command after --", []string{"run", dir, "--"}, exitUsage, "ORIGINAL -- CMD"},
		{"create without original", []string{"create"}, exitUsage, "ORIGINAL [MOUNTPOINT]"},
		{"create with three arguments", []string{"create", "a", "b", "c"}, exitUsage, "ORIGINAL [MOUNTPOINT]"},
		{"list with an argument", []string{"list", "x"}, exitUsage, "no arguments"},
		{"destroy of a non-id", []string{"destroy", "nope"}, exitUsage, "not a sandbox id"},
		{"destroy of an id and a plan", []string{"destroy", "--plan", "p", "0123456789abcdef"}, exitUsage, "not both"},
		{"commit of a plan and a path", []string{"commit", "--plan", "p", plain}, exitUsage, "not both"},
		{"commit of an unknown id", []string{"commit", "0123456789abcdef"}, exitNotSbxfs, "no sandbox 0123456789abcdef"},
		{"commit --git of a plan without -m", []string{"commit", "--git", "--plan", "p"}, exitUsage, "--git needs a commit message: give -m MSG"},
		{"run --git without --commit-on-success", []string{"run", "--git", dir, "--", "true"}, exitUsage, "give --commit-on-success too"},
		{"rollback --json standalone", []string{"rollback", "--json", plain}, exitUsage, "--json works on managed"},
		{"standalone commit still works as before", []string{"commit", plain}, exitNotSbxfs, "not an sbxfs mount"},
		{"gc with an argument", []string{"gc", "x"}, exitUsage, "no arguments"},
		{"daemon with an argument", []string{"daemon", "x"}, exitUsage, "no arguments"},
	}
	for _, tt := range tests {
		r := runBin(t, bin, append([]string{"--state-dir", root}, tt.args...)...)
		assertFailure(t, r, tt.code, tt.want)
	}
	assert.NoFileExists(t, filepath.Join(root, manager.DaemonSocket), "no daemon was started")
}

func TestManagedCreateRefusals(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o := e.original("o")
	assertFailure(t, e.sbxfs("create", filepath.Join(e.base, "missing")), exitBadPath, "missing")
	assertFailure(t, e.sbxfs("create", "--plan", "../x", o), exitBadPath, "plan")
	full := e.original("full")
	assertFailure(t, e.sbxfs("create", o, full), exitBadPath, "not empty")
	mnt := filepath.Join(e.base, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	cleanupMount(t, mnt)
	r := e.sbxfs("create", o, mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^[0-9a-f]{16}\t`+mnt+`\n$`, r.stdout)
	assert.True(t, isMounted(t, mnt))
	id := r.stdout[:16]
	r = e.sbxfs("destroy", id)
	require.Equal(t, 0, r.code, r.stderr)
	assert.False(t, isMounted(t, mnt))
	assert.DirExists(t, mnt, "a mountpoint the user gave stays")
}
