package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/manager"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run a command in a fresh sandbox of ORIGINAL, then commit or discard its changes",
		ArgsUsage: "ORIGINAL -- CMD [ARGS...]",
		Description: `Creates a managed sandbox of ORIGINAL, runs CMD with its working directory
inside the mount (the same subdirectory when the current directory lies in
ORIGINAL; $SBXFS_SANDBOX and $SBXFS_MOUNTPOINT name the sandbox), with
stdin, stdout and stderr passed through. Then, with --commit-on-success
and when CMD exited 0, commits its changes to ORIGINAL; otherwise destroys
the sandbox: ORIGINAL is unchanged. With --keep it keeps the sandbox
instead, mounted, with CMD's changes: review them with 'sbxfs diff ID'
(or status), then 'sbxfs commit ID' or 'sbxfs destroy ID'.

With --in-place CMD sees the sandbox at ORIGINAL's own path: a mount
namespace of its own binds the mount over ORIGINAL for CMD and what it
starts, nothing else (the rest of the machine still sees ORIGINAL). Tools
that record their own paths (a virtual environment's scripts, a build
directory's cache) then record ORIGINAL's, which hold once the changes are
committed there. As a user other than root it needs unprivileged user
namespaces (CMD then sees files of other users as owned by nobody).
Processes CMD leaves behind in its namespace keep a committed sandbox
mounted (empty), as a process left in the mount does; after a destroy
they are cut off (ENOTCONN). A managed sandbox CMD makes of a path in
ORIGINAL is nested in CMD's sandbox: its commit lands there.

With --git (and --commit-on-success) the commit is followed by a git
commit of exactly the paths it changed in ORIGINAL, which must lie in a
git work tree (checked before CMD runs); the message is -m MSG, else
"sbxfs run CMD ARGS...".

Exits with CMD's status (128+N when signal N killed it; 127 when it could
not be started), or with sbxfs's own code when sbxfs fails (7: the commit
met conflicts; the sandbox is then kept, mounted, to settle with 'sbxfs
resolve' and commit, commit with --force, or destroy). SIGTERM and SIGHUP are passed on to CMD; SIGINT and SIGQUIT from
the terminal reach it directly. With --json a summary is printed on
stdout after CMD's output.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "plan", Usage: "put the sandbox in plan `P`"},
			&cli.StringFlag{Name: "name", Usage: "describe the sandbox as `NAME`"},
			&cli.BoolFlag{Name: "commit-on-success", Usage: "commit the changes when CMD exits 0"},
			&cli.StringFlag{Name: "message", Aliases: []string{"m"}, Usage: "commit `MSG` (default: sbxfs run CMD ARGS...)"},
			&cli.BoolFlag{Name: "git", Usage: "with --commit-on-success, also make a git commit of exactly the committed paths (ORIGINAL in a git work tree)"},
			&cli.BoolFlag{Name: "json", Usage: "print a JSON summary after CMD's output"},
			&cli.BoolFlag{Name: "in-place", Usage: "show the sandbox to CMD at ORIGINAL's own path (in a mount namespace of CMD's own)"},
			&cli.BoolFlag{Name: "keep", Usage: "keep the sandbox, mounted, when it is not committed (for 'sbxfs diff ID', then commit or destroy)"},
		},
		OnUsageError: onUsageError,
		Action:       runRun,
	}
}

// runJSON is the --json summary of sbxfs run.
type runJSON struct {
	ID         string `json:"id"`
	Mountpoint string `json:"mountpoint"`
	// MountpointB64 is the mountpoint's exact bytes when they are not UTF-8.
	MountpointB64 string    `json:"mountpoint_b64,omitempty"`
	ExitCode      int       `json:"exit_code"`
	Committed     bool      `json:"committed"`
	Destroyed     bool      `json:"destroyed"`
	Kept          bool      `json:"kept,omitempty"` // --keep: neither committed nor destroyed
	Commit        *planJSON `json:"commit,omitempty"`
	Error         string    `json:"error,omitempty"`
	LeftBehind    []int     `json:"left_behind,omitempty"` // --in-place: processes CMD left in its namespace
}

func runRun(c *cli.Context) error {
	orig, argv, err := runArgs(c)
	if err != nil {
		return err
	}
	if c.Bool("git") {
		if !c.Bool("commit-on-success") {
			return failf(exitUsage, "--git makes a git commit of what run commits: give --commit-on-success too")
		}
		if err := commit.CheckGitWorkTree(orig); err != nil {
			return failf(exitBadPath, "--git: %v; nothing was run", err)
		}
	}
	root, err := managedRoot(c)
	if err != nil {
		return err
	}
	var sb manager.Sandbox
	err = withDaemon(c, func(d *manager.Daemon, root string) error {
		sb, err = d.Create(manager.CreateOptions{Plan: c.String("plan"), Name: c.String("name"), Original: daemonPath(orig)})
		if err != nil {
			return daemonFailure(err, root, exitMountFailed)
		}
		if !seenHere(sb) {
			_, _ = d.Destroy(manager.Target{ID: sb.ID})
			return failf(exitMountFailed, "%s; nothing was run", notSeenHere(sb))
		}
		return nil
	})
	if err != nil {
		return err
	}
	out := runJSON{ID: sb.ID, Mountpoint: sb.Mountpoint, MountpointB64: fsutil.B64IfInvalid(sb.Mountpoint)}
	out.ExitCode, out.LeftBehind = runInSandbox(c, sb, orig, argv)
	// A new connection: the daemon may have been restarted meanwhile.
	err = withDaemon(c, func(d *manager.Daemon, _ string) error {
		return endRun(c, d, root, sb, argv, &out)
	})
	if err != nil {
		out.Error = err.Error()
	}
	if c.Bool("json") {
		if perr := printJSON(c.App.Writer, out); perr != nil && err == nil {
			err = perr
		}
	}
	if err == nil && out.ExitCode != 0 {
		what := "the sandbox was destroyed"
		if out.Kept {
			what = "the sandbox " + sb.ID + " keeps its changes"
		}
		err = failf(out.ExitCode, "%s exited with status %d; %s, %s is unchanged", argv[0], out.ExitCode, what, orig)
	}
	return err
}

// runArgs splits the arguments of run into ORIGINAL and CMD ARGS...
func runArgs(c *cli.Context) (string, []string, error) {
	args := c.Args().Slice()
	if len(args) > 1 && args[1] == "--" {
		args = append(args[:1:1], args[2:]...)
	}
	if len(args) < 2 {
		return "", nil, failf(exitUsage, "run needs ORIGINAL -- CMD [ARGS...]; see 'sbxfs help run'")
	}
	if strings.HasPrefix(args[0], "-") {
		return "", nil, failf(exitUsage, "option %q after the arguments; put options before ORIGINAL (see 'sbxfs help run')", args[0])
	}
	if args[0] == "" {
		return "", nil, failf(exitUsage, "ORIGINAL is empty; give the directory to run in (see 'sbxfs help run')")
	}
	orig, err := filepath.Abs(args[0])
	if err != nil {
		return "", nil, failf(exitBadPath, "original %q: %v; give an absolute path", args[0], err)
	}
	if r, err := filepath.EvalSymlinks(orig); err == nil {
		orig = r // as the daemon records it
	}
	if fi, err := os.Stat(orig); err != nil || !fi.IsDir() {
		// 'sbxfs run -- CMD' (no ORIGINAL) lands here with CMD's name.
		why := "is not a directory"
		if err != nil {
			why = fmt.Sprintf("cannot be used (%v)", errors.Unwrap(err))
		}
		return "", nil, failf(exitBadPath, "ORIGINAL %s %s; run takes the directory to sandbox first: 'sbxfs run [OPTIONS] ORIGINAL -- CMD [ARGS...]'", args[0], why)
	}
	return orig, args[1:], nil
}

// runInSandbox runs argv inside sb's mount and returns its exit status
// and, with --in-place, the processes it left in its mount namespace.
// orig is the original as this process sees it (sb.Original is the
// daemon's view: daemonPath).
func runInSandbox(c *cli.Context, sb manager.Sandbox, orig string, argv []string) (int, []int) {
	cmd := exec.Command(argv[0], argv[1:]...)
	if c.Bool("in-place") {
		var err error
		if cmd, err = inPlaceCommand(inPlaceSpec{Mountpoint: sb.Mountpoint, Original: orig, Dir: inPlaceDir(orig),
			View: filepath.Join(filepath.Dir(sb.Work), manager.InPlaceView)}, argv); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "sbxfs: run --in-place: %v\n", err)
			return 126, nil
		}
	} else {
		cmd.Dir = sb.Mountpoint
		if wd := workingDir(); wd != "" && within(wd, orig) {
			rel, _ := filepath.Rel(orig, wd)
			cmd.Dir = filepath.Join(sb.Mountpoint, rel)
		}
	}
	cmd.Env = append(cmd.Environ(), "SBXFS_SANDBOX="+sb.ID, "SBXFS_MOUNTPOINT="+sb.Mountpoint)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.App.Writer, c.App.ErrWriter
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(c.App.ErrWriter, "sbxfs: run %s: %v\n", argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127, nil
		}
		return 126, nil
	}
	var ns string
	if c.Bool("in-place") {
		ns = mountNamespace(cmd.Process.Pid)
	}
	status := waitCommand(cmd, sigs)
	if ns == "" {
		return status, nil
	}
	return status, processesIn(ns)
}

// waitCommand waits for cmd, passing SIGTERM and SIGHUP on, and returns
// its exit status (128+N when signal N killed it).
func waitCommand(cmd *exec.Cmd, sigs <-chan os.Signal) int {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGTERM || s == syscall.SIGHUP {
					_ = cmd.Process.Signal(s)
				}
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return 1
	}
	return 0
}

// endRun commits the sandbox (when asked and CMD succeeded) or destroys
// it.
func endRun(c *cli.Context, d *manager.Daemon, root string, sb manager.Sandbox, argv []string, out *runJSON) error {
	if c.Bool("commit-on-success") && out.ExitCode == 0 {
		msg := c.String("message")
		if msg == "" {
			msg = "sbxfs run " + strings.Join(argv, " ")
		}
		// Processes left in CMD's namespace use the sandbox through a copy
		// of its mount that the unmount would cut off: keep it mounted.
		keep := len(out.LeftBehind) > 0
		res, err := d.Commit(manager.Target{ID: sb.ID}, manager.CommitOptions{Message: msg, Keep: keep})
		j := toPlanJSON(res)
		out.Commit, out.Committed = &j, err == nil
		var gitErr error // the commit is done whatever becomes of the git commit
		if err == nil && c.Bool("git") {
			j.GitCommits, gitErr = gitCommitApplied(res.Applied, msg)
		}
		if err != nil && errors.Is(err, commit.ErrConflict) {
			return fmt.Errorf("%w\nthe sandbox %s stays mounted at %s with the changes: 'sbxfs resolve %s PATH...' then 'sbxfs commit %s', 'sbxfs commit --force %s', or 'sbxfs destroy %s'",
				daemonFailure(err, root, exitCommitFailed), sb.ID, sb.Mountpoint, sb.ID, sb.ID, sb.ID, sb.ID)
		}
		if err != nil {
			return fmt.Errorf("%w\nthe sandbox %s stays mounted at %s with the changes: 'sbxfs commit %s' once the cause is settled, or 'sbxfs destroy %s'",
				daemonFailure(err, root, exitCommitFailed), sb.ID, sb.Mountpoint, sb.ID, sb.ID)
		}
		if keep {
			fmt.Fprintf(c.App.ErrWriter, "sbxfs: committed, but something CMD started still runs in its namespace (pid %s): the sandbox %s stays mounted at %s, empty; 'sbxfs destroy %s' when it is done\n",
				joinInts(out.LeftBehind), sb.ID, sb.Mountpoint, sb.ID)
			return gitErr
		}
		if len(res.StillMounted) > 0 {
			fmt.Fprintf(c.App.ErrWriter, "sbxfs: committed, but something CMD started still uses %s: the sandbox %s stays mounted there, empty; 'sbxfs destroy %s' when it is done\n", sb.Mountpoint, sb.ID, sb.ID)
		}
		return gitErr
	}
	if c.Bool("keep") {
		out.Kept = true
		fmt.Fprintf(c.App.ErrWriter, "sbxfs: the sandbox %s keeps CMD's changes, mounted at %s: review them with 'sbxfs diff %s', then 'sbxfs commit %s' or 'sbxfs destroy %s'\n",
			sb.ID, sb.Mountpoint, sb.ID, sb.ID, sb.ID)
		return nil
	}
	_, err := d.Destroy(manager.Target{ID: sb.ID})
	out.Destroyed = err == nil
	switch {
	case err == nil && out.ExitCode == 0:
		fmt.Fprintf(c.App.ErrWriter, "sbxfs: the sandbox %s was destroyed: its changes are discarded (--commit-on-success commits them)\n", sb.ID)
	case err != nil && out.ExitCode != 0: // CMD's status matters more; say what is left
		fmt.Fprintf(c.App.ErrWriter, "sbxfs: destroying the sandbox %s failed: %v\n", sb.ID, daemonFailure(err, root, exitInternal))
		return nil
	case err != nil:
		return daemonFailure(err, root, exitInternal)
	}
	return nil
}

// joinInts joins ns with commas.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

// workingDir is the current directory with its symlinks resolved, "" when
// it cannot be found.
func workingDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	if wd, err = filepath.EvalSymlinks(wd); err != nil {
		return ""
	}
	return wd
}
