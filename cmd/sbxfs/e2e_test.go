package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The end-to-end tests run the built binary as a user would, in its own
// process: the test process never serves a mount it also uses.

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error

	raceOnce sync.Once
	racePath string
	raceErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// sbxfsBin builds the sbxfs binary once per test run and returns its path.
func sbxfsBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "sbxfs-test-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "sbxfs")
		out, err := exec.Command(goBin(), "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binPath
}

// sbxfsRaceBin is the sbxfs binary built with -race when the tests run
// with -race (otherwise sbxfsBin): the tests of the daemon's shared ring
// threads run it, and a race it reports in its log fails them
// (stopDaemon). The other tests keep the plain binary, which starts
// several times faster.
func sbxfsRaceBin(t *testing.T) string {
	t.Helper()
	if !raceEnabled {
		return sbxfsBin(t)
	}
	dir := filepath.Dir(sbxfsBin(t))
	raceOnce.Do(func() {
		racePath = filepath.Join(dir, "sbxfs-race")
		out, err := exec.Command(goBin(), "build", "-race", "-o", racePath, ".").CombinedOutput()
		if err != nil {
			raceErr = fmt.Errorf("go build -race: %v\n%s", err, out)
		}
	})
	require.NoError(t, raceErr)
	return racePath
}

// goBin is the go command: on PATH, or where the machine's Go lives.
func goBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// result is what one run of the binary gave.
type result struct {
	code           int
	stdout, stderr string
}

// runBin runs the binary at bin with args and returns its exit code and
// output; it fails the test if the binary hangs.
func runBin(t *testing.T, bin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		require.NoError(t, err, "run %s %q", bin, args)
	}
	require.NoError(t, ctx.Err(), "%s %q did not finish", bin, args)
	t.Logf("%s %q: exit %d\nstdout: %s\nstderr: %s", filepath.Base(bin), args, r.code, r.stdout, r.stderr)
	return r
}

// assertFailure checks the exit code and that stderr is one sbxfs
// message holding want, without a Go trace.
func assertFailure(t *testing.T, r result, code int, want string) {
	t.Helper()
	assert.Equal(t, code, r.code, "exit code")
	assert.True(t, strings.HasPrefix(r.stderr, "sbxfs: "), "stderr starts with sbxfs: %q", r.stderr)
	assert.Contains(t, r.stderr, want)
	assert.NotContains(t, r.stderr, "goroutine")
	assert.NotContains(t, r.stderr, "panic")
}

func TestCLIErrors(t *testing.T) {
	t.Parallel()
	bin := sbxfsBin(t)
	dir := realTempDir(t)
	orig := filepath.Join(dir, "orig")
	mnt := filepath.Join(dir, "mnt")
	full := filepath.Join(dir, "full")
	file := filepath.Join(dir, "file")
	for _, d := range []string{orig, mnt, full} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(full, "x"), nil, 0o644))
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	missing := filepath.Join(dir, "no-such-original")
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", orig, full, full)

	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing original", []string{"mount", "--upper", filepath.Join(dir, "sb"), missing, mnt}, exitBadPath, missing},
		{"original is a file", []string{"mount", file, mnt}, exitBadPath, "is not a directory"},
		{"missing mountpoint", []string{"mount", orig, filepath.Join(dir, "nomnt")}, exitBadPath, "mkdir -p"},
		{"mountpoint not empty", []string{"mount", orig, full}, exitBadPath, "is not empty"},
		{"mountpoint inside original", []string{"mount", "--upper", filepath.Join(dir, "sb"), dir, mnt}, exitBadPath, "is inside the original"},
		{"upper inside original", []string{"mount", "--upper", filepath.Join(orig, "sb"), orig, mnt}, exitBadPath, "is inside the original"},
		{"unknown subcommand", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"unknown flag", []string{"mount", "--frob", orig, mnt}, exitUsage, "-frob"},
		{"too few arguments", []string{"mount", orig}, exitUsage, "ORIGINAL MOUNTPOINT"},
		{"option after arguments", []string{"mount", orig, mnt, "--foreground"}, exitUsage, "put options before"},
		{"unknown -o option", []string{"sbxfs", mnt, "-o", opts + ",frob"}, exitUsage, `unknown mount option "frob"`},
		{"ro refused", []string{"sbxfs", mnt, "-o", opts + ",ro"}, exitUsage, "always writable"},
		{"helper without workdir", []string{"sbxfs", mnt, "-o", "lowerdir=" + orig + ",upperdir=" + full}, exitUsage, "workdir= is missing"},
		{"unmount of a plain directory", []string{"unmount", mnt}, exitNotSbxfs, "not an sbxfs mount"},
		{"unmount of another file system", []string{"unmount", "/proc"}, exitNotSbxfs, "not an sbxfs mount (it is proc"},
		{"status of a plain directory", []string{"status", mnt}, exitNotSbxfs, "not an sbxfs mount or sandbox"},
		{"status of a missing path", []string{"status", missing}, exitBadPath, "does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runBin(t, bin, tt.args...)
			assertFailure(t, r, tt.code, tt.want)
			assert.Contains(t, r.stderr, ";", "the message says what to do")
		})
	}
	assert.NoDirExists(t, filepath.Join(dir, "sb"), "a refused mount creates no sandbox")
	assert.NoDirExists(t, filepath.Join(orig, "sb"))
}

func TestCLIHelperNameUnknownOption(t *testing.T) {
	t.Parallel()
	dir := realTempDir(t)
	helper := filepath.Join(dir, "mount.fuse.sbxfs")
	require.NoError(t, os.Symlink(sbxfsBin(t), helper))
	r := runBin(t, helper, "sbxfs", dir, "-o", "lowerdir=/a,upperdir=/b,workdir=/c,bogus=1")
	assertFailure(t, r, exitUsage, `unknown mount option "bogus=1"`)
	r = runBin(t, helper)
	assertFailure(t, r, exitUsage, "mount -t fuse.sbxfs")
}

func TestCLIHelpAndVersion(t *testing.T) {
	t.Parallel()
	bin := sbxfsBin(t)
	r := runBin(t, bin, "--version")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "sbxfs version ")
	r = runBin(t, bin, "help")
	assert.Equal(t, 0, r.code)
	for _, want := range []string{"mount", "unmount", "status", "fuse.sbxfs", "Exit codes"} {
		assert.Contains(t, r.stdout, want)
	}
	r = runBin(t, bin, "help", "mount")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "--upper DIR")
	r = runBin(t, bin)
	assert.Equal(t, exitUsage, r.code)
}
