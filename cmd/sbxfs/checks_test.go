package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
)

// realTempDir is t.TempDir with its symlinks resolved.
func realTempDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	return d
}

func TestLayoutCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		l       layout
		errText string
	}{
		{name: "separate", l: layout{"/m", []string{"/o"}, "/s/upper", "/s/work"}},
		{name: "several lowers may nest", l: layout{"/m", []string{"/o", "/o/base"}, "/s/upper", "/s/work"}},
		{name: "mountpoint inside original", l: layout{"/o/m", []string{"/o"}, "/s/upper", "/s/work"},
			errText: `mountpoint "/o/m" is inside the original "/o"`},
		{name: "original inside mountpoint", l: layout{"/m", []string{"/m/o"}, "/s/upper", "/s/work"},
			errText: `original "/m/o" is inside the mountpoint "/m"`},
		{name: "mountpoint is original", l: layout{"/o", []string{"/o"}, "/s/upper", "/s/work"},
			errText: `mountpoint "/o" is also the original`},
		{name: "upper inside original", l: layout{"/m", []string{"/o"}, "/o/.sb/upper", "/o/.sb/work"},
			errText: `upper directory "/o/.sb/upper" is inside the original "/o"`},
		{name: "upper inside second lower", l: layout{"/m", []string{"/o", "/b"}, "/b/upper", "/s/work"},
			errText: `upper directory "/b/upper" is inside the lower layer 2 "/b"`},
		{name: "upper inside mountpoint", l: layout{"/m", []string{"/o"}, "/m/s/upper", "/m/s/work"},
			errText: `upper directory "/m/s/upper" is inside the mountpoint "/m"`},
		{name: "mountpoint inside upper", l: layout{"/s/upper/m", []string{"/o"}, "/s/upper", "/s/work"},
			errText: `mountpoint "/s/upper/m" is inside the upper directory`},
		{name: "work inside upper", l: layout{"/m", []string{"/o"}, "/s/upper", "/s/upper/work"},
			errText: `work directory "/s/upper/work" is inside the upper directory`},
		{name: "original is root", l: layout{"/m", []string{"/"}, "/s/upper", "/s/work"},
			errText: `mountpoint "/m" is inside the original "/"`},
		{name: "prefix is not nesting", l: layout{"/om", []string{"/o"}, "/o2/upper", "/o2/work"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.l.check()
			if tt.errText == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.errText)
			assert.Equal(t, exitBadPath, exitCode(err))
		})
	}
}

func TestResolveDir(t *testing.T) {
	t.Parallel()
	dir := realTempDir(t)
	real := filepath.Join(dir, "real")
	require.NoError(t, os.Mkdir(real, 0o755))
	require.NoError(t, os.Symlink(real, filepath.Join(dir, "link")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "file"), nil, 0o644))

	got, err := resolveDir("original", filepath.Join(dir, "link"), "")
	require.NoError(t, err)
	assert.Equal(t, real, got, "symlinks are resolved")

	_, err = resolveDir("original", filepath.Join(dir, "missing"), "give an existing directory")
	require.Error(t, err)
	assert.Equal(t, exitBadPath, exitCode(err))
	assert.Contains(t, err.Error(), "missing")
	assert.Contains(t, err.Error(), "does not exist; give an existing directory")

	_, err = resolveDir("original", filepath.Join(dir, "file"), "")
	require.Error(t, err)
	assert.Equal(t, exitBadPath, exitCode(err))
	assert.Contains(t, err.Error(), "is not a directory")
}

func TestSymlinkedMountpointInsideOriginal(t *testing.T) {
	t.Parallel()
	dir := realTempDir(t)
	orig := filepath.Join(dir, "orig")
	require.NoError(t, os.MkdirAll(filepath.Join(orig, "m"), 0o755))
	// a symlink outside the original that leads into it
	require.NoError(t, os.Symlink(filepath.Join(orig, "m"), filepath.Join(dir, "mnt")))
	o, err := resolveDir("original", orig, "")
	require.NoError(t, err)
	m, err := checkMountpoint(nil, filepath.Join(dir, "mnt"))
	require.NoError(t, err)
	l := layout{mountpoint: m, lowers: []string{o}, upper: filepath.Join(dir, "s/upper"), work: filepath.Join(dir, "s/work")}
	err = l.check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is inside the original")
}

func TestResolvePathMissingTail(t *testing.T) {
	t.Parallel()
	dir := realTempDir(t)
	require.NoError(t, os.Symlink(dir, filepath.Join(dir, "link")))
	got, err := resolvePath(filepath.Join(dir, "link", "a", "b"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "a", "b"), got)
}

func TestCheckMountpoint(t *testing.T) {
	t.Parallel()
	dir := realTempDir(t)
	empty := filepath.Join(dir, "empty")
	full := filepath.Join(dir, "full")
	require.NoError(t, os.Mkdir(empty, 0o755))
	require.NoError(t, os.Mkdir(full, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(full, ".hidden"), nil, 0o644))

	got, err := checkMountpoint(nil, empty)
	require.NoError(t, err)
	assert.Equal(t, empty, got)

	_, err = checkMountpoint(nil, full)
	require.Error(t, err)
	assert.Equal(t, exitBadPath, exitCode(err))
	assert.Contains(t, err.Error(), "is not empty")

	_, err = checkMountpoint(nil, filepath.Join(dir, "nope"))
	require.Error(t, err)
	assert.Equal(t, exitBadPath, exitCode(err))
	assert.Contains(t, err.Error(), "mkdir -p")

	mounts := []fsutil.MountEntry{{Mountpoint: empty, FSType: "ext4", Source: "/dev/sda1"}}
	_, err = checkMountpoint(mounts, empty)
	require.Error(t, err)
	assert.Equal(t, exitBusy, exitCode(err))
	assert.Contains(t, err.Error(), "already a mount point")
}

func TestCheckSandboxFree(t *testing.T) {
	t.Parallel()
	mounts := []fsutil.MountEntry{{Mountpoint: "/m", FSType: fsType, Source: "/s/work", SuperOpts: fmt.Sprintf("rw,user_id=%d", os.Geteuid())},
		{Mountpoint: "/n", FSType: fsType, Source: "/u/work", SuperOpts: fmt.Sprintf("rw,user_id=%d", os.Geteuid()+4242)}}
	assert.NoError(t, checkSandboxFree(mounts, "/t/work"))
	assert.NoError(t, checkSandboxFree(mounts, "/u/work"), "another user's mount naming it is not this user's sandbox's")
	err := checkSandboxFree(mounts, "/s/work")
	require.Error(t, err)
	assert.Equal(t, exitBusy, exitCode(err))
	assert.Contains(t, err.Error(), "already mounted at /m")
}

func TestMakeSandboxReuses(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(realTempDir(t), "a", "sb")
	require.NoError(t, makeSandbox(dir))
	upper, work := sandboxDirs(dir)
	for _, d := range []string{dir, upper, work} {
		st, err := os.Stat(d)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), d)
	}
	require.NoError(t, os.WriteFile(filepath.Join(upper, "kept"), nil, 0o600))
	require.NoError(t, makeSandbox(dir))
	assert.FileExists(t, filepath.Join(upper, "kept"))

	file := filepath.Join(realTempDir(t), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	err := makeSandbox(file)
	require.Error(t, err)
	assert.Equal(t, exitBadPath, exitCode(err))
}

func TestStateRoot(t *testing.T) {
	// not parallel: changes the environment
	t.Setenv("SBXFS_STATE_DIR", "/state/env")
	got, err := stateRoot("/state/flag")
	require.NoError(t, err)
	assert.Equal(t, "/state/flag", got)
	got, err = stateRoot("")
	require.NoError(t, err)
	assert.Equal(t, "/state/env", got)
	t.Setenv("SBXFS_STATE_DIR", "")
	t.Setenv("XDG_STATE_HOME", "/xdg")
	got, err = stateRoot("")
	require.NoError(t, err)
	if os.Geteuid() == 0 {
		assert.Equal(t, "/var/lib/sbxfs", got)
	} else {
		assert.Equal(t, "/xdg/sbxfs", got)
	}
	p, err := newSandboxPath("/r")
	require.NoError(t, err)
	assert.Regexp(t, `^/r/mounts/[0-9a-f]{16}$`, p)
}
