package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/manager"
)

func daemonCommand() *cli.Command {
	return &cli.Command{
		Name:            "daemon",
		Usage:           "serve the managed sandboxes of the state root",
		UsageText:       "sbxfs daemon [--foreground]\nsbxfs daemon stop [--json]\nsbxfs daemon status [--json]",
		HideHelpCommand: true,
		Description: `Runs the manager of the state root: it mounts every active sandbox, answers
the managed commands (create, list, commit --plan, rollback --plan,
destroy, gc, run, unmount) on STATE/daemon.sock, and serves until SIGINT,
SIGTERM or 'sbxfs daemon stop'. Then it unmounts the sandboxes, which stay
active: the next daemon mounts them again. The managed commands start it
when it is not running, so it rarely needs starting by hand.

One daemon per state root: a second one exits 4 (busy). In the background
(the default) it logs to STATE/daemon.log and the command returns once it
answers.

The daemon's mounts take the kernel's requests through io_uring where the
kernel offers it (the fuse module's enable_uring is Y), else through
/dev/fuse; --no-io-uring keeps them on /dev/fuse. The choice holds until
the daemon stops: a daemon the managed commands start has no
--no-io-uring, so start it by hand to have it. Each mount's transport is
in the daemon's log ("sandbox mounted"). Through io_uring every mount is
served by the same ring threads, one a CPU (sbxfs-ringN).`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "foreground", Usage: "serve in this process, logging to stderr"},
			&cli.BoolFlag{Name: "no-io-uring", Usage: "take the kernel's requests for every mount from /dev/fuse even where the kernel offers io_uring (fuse module parameter enable_uring)"},
		},
		Subcommands: []*cli.Command{
			{
				Name:  "stop",
				Usage: "stop the daemon of the state root (its sandboxes stay active)",
				Description: `Asks the daemon of the state root to stop, as SIGTERM does: it unmounts every
sandbox (they stay active, with their changes; the next daemon mounts them
again) and exits. Waits until it has exited. Exit 0 also when no daemon
runs (it says so).`,
				Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print {state_root, running, stopped, pid} as JSON"}},
				OnUsageError: onUsageError,
				Action:       runDaemonStop,
			},
			{
				Name:  "status",
				Usage: "say whether a daemon serves the state root",
				Description: `Says whether a daemon serves the state root, and if so its pid and how many
sandboxes it knows, is keeping active and has mounted. Never starts one.
Exit 0 whether or not one runs (--json: "running").`,
				Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print {state_root, running, pid, sandboxes, active, mounted} as JSON"}},
				OnUsageError: onUsageError,
				Action:       runDaemonStatus,
			},
		},
		OnUsageError: onUsageError,
		Action:       runDaemon,
	}
}

// daemonStopTimeout bounds the wait for a stopping daemon to exit (it
// unmounts every sandbox first, waiting up to 10 s for each busy one).
const daemonStopTimeout = 60 * time.Second

// daemonJSON is the --json output of 'daemon stop' and 'daemon status'.
type daemonJSON struct {
	StateRoot string `json:"state_root"`
	Running   bool   `json:"running"`
	Stopped   *bool  `json:"stopped,omitempty"` // stop only
	Pid       int    `json:"pid,omitempty"`
	Sandboxes *int   `json:"sandboxes,omitempty"` // status only, when running
	Active    *int   `json:"active,omitempty"`
	Mounted   *int   `json:"mounted,omitempty"`
}

func runDaemonStop(c *cli.Context) error {
	if err := checkArgs(c, c.Args().Slice(), 0, "no arguments"); err != nil {
		return err
	}
	root, err := managedRoot(c)
	if err != nil {
		return err
	}
	out := daemonJSON{StateRoot: root}
	stopped := false
	out.Stopped = &stopped
	d, err := manager.DialDaemon(root)
	if err != nil {
		if c.Bool("json") {
			return printJSON(c.App.Writer, out)
		}
		fmt.Fprintf(c.App.Writer, "no daemon serves %s\n", root)
		return nil
	}
	pid := d.Pid
	err = d.Stop()
	d.Close()
	if err != nil {
		return daemonFailure(err, root, exitInternal)
	}
	if !waitProcessExit(pid, daemonStopTimeout) {
		return failf(exitInternal, "the daemon (pid %d) has not exited %s after it was asked to stop; see %s", pid, daemonStopTimeout, daemonLog(root))
	}
	stopped = true
	out.Pid = pid
	if c.Bool("json") {
		return printJSON(c.App.Writer, out)
	}
	fmt.Fprintf(c.App.Writer, "daemon of %s stopped (pid %d)\n", root, pid)
	return nil
}

func runDaemonStatus(c *cli.Context) error {
	if err := checkArgs(c, c.Args().Slice(), 0, "no arguments"); err != nil {
		return err
	}
	root, err := managedRoot(c)
	if err != nil {
		return err
	}
	out := daemonJSON{StateRoot: root}
	d, err := manager.DialDaemon(root)
	if err != nil {
		if c.Bool("json") {
			return printJSON(c.App.Writer, out)
		}
		fmt.Fprintf(c.App.Writer, "no daemon serves %s\n", root)
		return nil
	}
	defer d.Close()
	sbs, err := d.List("")
	if err != nil {
		return daemonFailure(err, root, exitInternal)
	}
	total, active, mounted := len(sbs), 0, 0
	for _, sb := range sbs {
		if sb.State == manager.Active {
			active++
		}
		if sb.Mounted {
			mounted++
		}
	}
	out.Running, out.Pid, out.Sandboxes, out.Active, out.Mounted = true, d.Pid, &total, &active, &mounted
	if c.Bool("json") {
		return printJSON(c.App.Writer, out)
	}
	fmt.Fprintf(c.App.Writer, "daemon of %s: pid %d, %d sandboxes (%d active, %d mounted), log %s\n",
		root, d.Pid, total, active, mounted, daemonLog(root))
	return nil
}

// waitProcessExit waits up to timeout for process pid to exit (a zombie
// nobody reaps counts as exited).
func waitProcessExit(pid int, timeout time.Duration) bool {
	return waitGone(timeout, func() (int, bool) { return pid, !processAlive(pid) }) == 0
}

// processAlive reports whether pid is a running process (not a zombie).
func processAlive(pid int) bool {
	_, ok := fsutil.ProcessStart(pid)
	return ok
}

func runDaemon(c *cli.Context) error {
	if err := checkArgs(c, c.Args().Slice(), 0, "no arguments"); err != nil {
		return err
	}
	root, err := managedRoot(c)
	if err != nil {
		return err
	}
	if c.Bool("foreground") {
		return serveDaemon(root, c)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return failf(exitBadPath, "state root %s: %v; check --state-dir", root, err)
	}
	var extra []string
	if c.Bool("no-io-uring") {
		extra = append(extra, "--no-io-uring")
	}
	if err := startDaemon(root, extra...); err != nil {
		return err
	}
	d, err := manager.DialDaemon(root)
	if err != nil {
		return failf(exitInternal, "the daemon started but does not answer: %v; see %s", err, daemonLog(root))
	}
	defer d.Close()
	fmt.Fprintf(c.App.Writer, "daemon of %s started (pid %d, log %s)\n", root, d.Pid, daemonLog(root))
	return nil
}

// serveDaemon runs the manager of root in this process until SIGINT or
// SIGTERM.
func serveDaemon(root string, c *cli.Context) error {
	// The daemon's working directory must not hold any mount it serves.
	if err := os.Chdir("/"); err != nil {
		return err
	}
	// GOMAXPROCS stays at the CPU count here (see serverProcs).
	// Catch signals before mounting (see serve).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	m, err := manager.New(manager.Options{StateRoot: root, Mount: true, NoIOUring: c.Bool("no-io-uring"), Logger: logger, Fault: faultFromEnv(logger)})
	switch {
	case errors.Is(err, manager.ErrLocked):
		return failf(exitBusy, "%v; a daemon already serves this state root: use it, or stop that process first", err)
	case errors.Is(err, manager.ErrInvalid):
		return failf(exitBadPath, "%v; check --state-dir", err)
	case err != nil:
		return fmt.Errorf("open the state root: %w", err)
	}
	srv, err := manager.ServeDaemon(m, root)
	if err != nil {
		_ = m.Close()
		return err
	}
	logger.Info("daemon serving", "state_root", m.StateRoot(), "socket", srv.Path(), "pid", os.Getpid())
	ready.ok()
	select {
	case s := <-sigs:
		logger.Info("daemon stopping", "signal", s.String())
	case <-srv.StopRequested():
		logger.Info("daemon stopping", "requested", "sbxfs daemon stop")
	}
	_ = srv.Close()
	if err := m.Close(); err != nil {
		return fmt.Errorf("close the manager: %w", err)
	}
	logger.Info("daemon stopped")
	return nil
}

// faultEnv names a fault point of the plan commit protocol
// (manager.CommitOptions.Fault: prepared-all, plan-recorded, applied-<k>,
// nested-committed-<level>, nested-ended-<level>, plan-committed,
// finished) at which the daemon kills itself with SIGKILL. For the crash
// tests only (cmd/sbxfs/crash_test.go); never set it otherwise.
const faultEnv = "SBXFS_FAULT"

func faultFromEnv(logger *slog.Logger) func(string) {
	want := os.Getenv(faultEnv)
	if want == "" {
		return nil
	}
	logger.Warn("test fault injection is on: the daemon kills itself at a plan commit point", "env", faultEnv, "point", want)
	return func(point string) {
		if point == want {
			logger.Warn("fault point reached: SIGKILL", "point", point)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}
