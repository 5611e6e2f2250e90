package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/manager"
)

// TestBadInputEverySubcommand runs every subcommand with wrong arguments,
// unknown flags and values, unknown ids and paths that do not exist or
// are not what the command needs: each exits with its documented code
// (exitcodes.go), says what went wrong and what to do in one "sbxfs: "
// message, and prints no Go trace. Only create and run start the daemon
// (which checks their ORIGINAL).
// (TestCLIErrors and TestManagedCLIErrors hold more cases of mount and of
// the managed commands; this table covers every subcommand once more.)
func TestBadInputEverySubcommand(t *testing.T) {
	t.Parallel()
	bin := sbxfsBin(t)
	dir := realTempDir(t)
	root := filepath.Join(dir, "state")
	plain := filepath.Join(dir, "plain") // an empty directory, no sandbox
	file := filepath.Join(dir, "file")
	missing := filepath.Join(dir, "missing")
	orig := filepath.Join(dir, "orig")
	mnt := filepath.Join(dir, "mnt")
	for _, d := range []string{plain, orig, mnt} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	require.NoError(t, os.Symlink(file, filepath.Join(dir, "upper-link")))
	unknownID := "fedcba9876543210"

	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		// global
		{"unknown global flag", []string{"--frobnicate", "list"}, exitUsage, "frobnicate"},
		{"state dir without a value", []string{"--state-dir"}, exitUsage, "state-dir"},
		{"help of an unknown command", []string{"help", "frobnicate"}, exitUsage, "frobnicate"},
		// mount
		{"mount without arguments", []string{"mount"}, exitUsage, "ORIGINAL MOUNTPOINT"},
		{"mount with three arguments", []string{"mount", orig, mnt, plain}, exitUsage, "ORIGINAL MOUNTPOINT"},
		{"mount with an upper that is a file", []string{"mount", "--upper", file, orig, mnt}, exitBadPath, "not a directory"},
		{"mount with an upper where no directory can be made", []string{"mount", "--upper", "/proc/sbxfs-upper", orig, mnt}, exitBadPath,
			"mkdir /proc/sbxfs-upper: no such file or directory; give an --upper on a file system that holds ordinary directories"},
		{"mount with an empty original", []string{"mount", "", mnt}, exitUsage, "argument 1 of mount is empty"},
		{"mount with an empty mountpoint", []string{"mount", orig, ""}, exitUsage, "argument 2 of mount is empty"},
		{"mount of an unknown id", []string{"mount", unknownID}, exitNotSbxfs, "no sandbox " + unknownID},
		{"mount of one plain directory", []string{"mount", plain}, exitUsage, "not the mountpoint of a managed sandbox"},
		{"mount of one missing path", []string{"mount", missing}, exitBadPath, "does not exist"},
		{"mount of an empty id", []string{"mount", ""}, exitUsage, "argument 1 of mount is empty"},
		{"mount of an id with --upper", []string{"mount", "--upper", plain, unknownID}, exitUsage, "--upper is for a standalone mount"},
		// unmount
		{"unmount without arguments", []string{"unmount"}, exitUsage, "MOUNTPOINT"},
		{"unmount with two arguments", []string{"unmount", mnt, plain}, exitUsage, "MOUNTPOINT"},
		{"unmount with an unknown flag", []string{"unmount", "--force", mnt}, exitUsage, "force"},
		{"unmount of a missing path", []string{"unmount", missing}, exitNotSbxfs, "not a mount point"},
		{"unmount of a file", []string{"umount", file}, exitNotSbxfs, "not a mount point"},
		// status
		{"status without arguments", []string{"status"}, exitUsage, "MOUNTPOINT|DIR"},
		{"status with two arguments", []string{"status", plain, plain}, exitUsage, "MOUNTPOINT|DIR"},
		{"status with an unknown flag", []string{"status", "--yaml", plain}, exitUsage, "yaml"},
		{"status of a file", []string{"status", file}, exitNotSbxfs, "not an sbxfs mount or sandbox"},
		{"status of an empty path", []string{"status", ""}, exitUsage, "is empty"},
		{"status of an unknown id", []string{"status", "0123456789abcdef"}, exitNotSbxfs, "no sandbox 0123456789abcdef"},
		// diff
		{"diff without arguments", []string{"diff"}, exitUsage, "MOUNTPOINT|DIR"},
		{"diff with two forms", []string{"diff", "--stat", "--json", plain}, exitUsage, "exclude one another"},
		{"diff with negative context", []string{"diff", "-U", "-1", plain}, exitUsage, "-U -1"},
		{"diff with a non-number context", []string{"diff", "-U", "many", plain}, exitUsage, "many"},
		{"diff of a missing path", []string{"diff", missing}, exitBadPath, "does not exist"},
		{"diff of a plain directory", []string{"diff", plain}, exitNotSbxfs, "not an sbxfs mount or sandbox"},
		{"diff of an unknown id", []string{"diff", "0123456789abcdef"}, exitNotSbxfs, "no sandbox 0123456789abcdef"},
		// commit
		{"commit without arguments", []string{"commit"}, exitUsage, "MOUNTPOINT|DIR"},
		{"commit with an unknown flag", []string{"commit", "--all", plain}, exitUsage, "all"},
		{"commit with a bad --wait", []string{"commit", "--wait", "soon", plain}, exitUsage, "soon"},
		{"commit of a missing path", []string{"commit", missing}, exitBadPath, "does not exist"},
		{"commit of a file", []string{"commit", file}, exitNotSbxfs, "not an sbxfs mount or sandbox"},
		{"commit of an unknown id", []string{"commit", unknownID}, exitNotSbxfs, "no sandbox " + unknownID},
		{"commit of an empty path", []string{"commit", ""}, exitUsage, "is empty"},
		{"commit with an option after the path", []string{"commit", plain, "--force"}, exitUsage, "put options before"},
		// resolve
		{"resolve without arguments", []string{"resolve"}, exitUsage, "MOUNTPOINT|DIR|ID [PATH...]"},
		{"resolve of a missing path", []string{"resolve", missing, "a"}, exitBadPath, "does not exist"},
		{"resolve of a plain directory", []string{"resolve", plain}, exitNotSbxfs, "not an sbxfs mount or sandbox"},
		{"resolve of an unknown id", []string{"resolve", unknownID}, exitNotSbxfs, "no sandbox " + unknownID},
		{"resolve with an option after the path", []string{"resolve", plain, "a", "--json"}, exitUsage, "put options before"},
		// rollback
		{"rollback without arguments", []string{"rollback"}, exitUsage, "MOUNTPOINT|DIR"},
		{"rollback with a bad --wait", []string{"rollback", "--keep", "--wait", "-", plain}, exitUsage, "wait"},
		{"rollback with a negative --wait", []string{"rollback", "--keep", "--wait", "-1s", plain}, exitUsage, "--wait -1s is negative; give a duration of 0 or more"},
		{"commit with a negative --wait", []string{"commit", "--wait", "-5m", plain}, exitUsage, "--wait -5m0s is negative; give a duration of 0 or more"},
		{"rollback of a missing path", []string{"rollback", missing}, exitBadPath, "does not exist"},
		{"rollback of a plain directory", []string{"rollback", plain}, exitNotSbxfs, "not an sbxfs mount or sandbox"},
		{"rollback of an unknown id", []string{"rollback", unknownID}, exitNotSbxfs, "no sandbox " + unknownID},
		// recover
		{"recover without arguments", []string{"recover"}, exitUsage, "MOUNTPOINT|DIR"},
		{"recover with two arguments", []string{"recover", plain, plain}, exitUsage, "MOUNTPOINT|DIR"},
		{"recover of a missing path", []string{"recover", missing}, exitBadPath, "does not exist"},
		{"recover of a plain directory", []string{"recover", plain}, exitNotSbxfs, "not an sbxfs mount or sandbox"},
		// create
		{"create of a missing original", []string{"create", missing}, exitBadPath, "missing"},
		{"create of a file", []string{"create", file}, exitBadPath, "not a directory"},
		{"create with an unknown flag", []string{"create", "--size", "3", orig}, exitUsage, "size"},
		{"create of an empty path", []string{"create", ""}, exitUsage, "is empty"},
		// list
		{"list with an unknown flag", []string{"list", "--all"}, exitUsage, "all"},
		// destroy
		{"destroy without arguments", []string{"destroy"}, exitUsage, "ID or --plan P"},
		{"destroy of a path", []string{"destroy", plain}, exitUsage, "not a sandbox id"},
		// gc
		{"gc with an unknown flag", []string{"gc", "--now"}, exitUsage, "now"},
		// run
		{"run without arguments", []string{"run"}, exitUsage, "ORIGINAL -- CMD"},
		{"run of a missing original", []string{"run", missing, "--", "true"}, exitBadPath, "missing"},
		{"run of a file", []string{"run", file, "--", "true"}, exitBadPath, "is not a directory; run takes the directory to sandbox first"},
		{"run without ORIGINAL", []string{"run", "--", "no-such-cmd", "-c", "true"}, exitBadPath, "ORIGINAL no-such-cmd cannot be used (no such file or directory); run takes the directory to sandbox first"},
		{"run of an empty original", []string{"run", "", "--", "true"}, exitUsage, "ORIGINAL is empty"},
		{"run with an unknown flag", []string{"run", "--commit", orig, "--", "true"}, exitUsage, "commit"},
		// daemon
		{"daemon with an unknown flag", []string{"daemon", "--background"}, exitUsage, "background"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		seen[strings.TrimPrefix(tt.args[0], "--frobnicate")] = true
		t.Run(tt.name, func(t *testing.T) {
			r := runBin(t, bin, append([]string{"--state-dir", root}, tt.args...)...)
			// create and run start the daemon first (it checks ORIGINAL)
			// and say so.
			started := regexp.MustCompile(`^sbxfs: started the daemon of .*\n`)
			if loc := started.FindStringIndex(r.stderr); loc != nil {
				assert.Contains(t, []string{"create", "run"}, tt.args[0], "only create and run start the daemon")
				r.stderr = r.stderr[loc[1]:]
			}
			assertFailure(t, r, tt.code, tt.want)
			assert.Contains(t, r.stderr, ";", "the message says what to do")
			assert.Equal(t, 1, strings.Count(strings.TrimSuffix(r.stderr, "\n"), "sbxfs: "), "one message")
			assert.Empty(t, r.stdout, "nothing on stdout")
		})
	}
	for _, c := range newApp(nil, nil).Commands {
		if !seen[c.Name] {
			t.Errorf("no bad-input case for subcommand %q", c.Name)
		}
	}
	// Stop the daemon create and run started.
	if d, err := manager.DialDaemon(root); err == nil {
		pid := d.Pid
		d.Close()
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		}
	}
	assert.NoDirExists(t, filepath.Join(plain, "work"), "no sandbox was made")
	entries, _ := os.ReadDir(mnt)
	assert.Empty(t, entries)
}

// TestNoProcSaysMountIt runs sbxfs where /proc is not mounted (a mount
// namespace that unmounted it): mount, status and commit fail with one
// message that names the cause and the fix, mount nothing and change
// neither the original nor the sandbox.
func TestNoProcSaysMountIt(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("unshare -m needs root")
	}
	bin := sbxfsBin(t)
	dir := realTempDir(t)
	orig, mnt, upper := filepath.Join(dir, "orig"), filepath.Join(dir, "mnt"), filepath.Join(dir, "upper")
	for _, d := range []string{orig, mnt} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(orig, "a"), []byte("original"), 0o644))
	for _, args := range [][]string{
		{"mount", "--upper", upper, orig, mnt},
		{"status", upper},
		{"commit", upper},
	} {
		cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
			`umount -l /proc && exec "$@"`, "sh", bin)
		cmd.Args = append(cmd.Args, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v: %s", args, stderr.String())
		assert.Equal(t, exitInternal, ee.ExitCode(), "%v", args)
		assert.Regexp(t, `^sbxfs: no /proc: .*mount it \(mount -t proc proc /proc\) and try again \(.*\)\n$`, stderr.String(), "%v", args)
		assert.Empty(t, stdout.String(), "%v", args)
	}
	entries, err := os.ReadDir(mnt)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing was mounted")
	got, err := os.ReadFile(filepath.Join(orig, "a"))
	require.NoError(t, err)
	assert.Equal(t, "original", string(got))
}
