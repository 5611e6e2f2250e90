package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/manager"
)

func daemonCommand() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "serve the managed sandboxes of the state root",
		Description: `Runs the manager of the state root: it mounts every active sandbox, answers
the managed commands (create, list, commit --plan, rollback --plan,
destroy, gc, run) on STATE/daemon.sock, and serves until SIGINT or
SIGTERM. Then it unmounts the sandboxes, which stay active: the next daemon
mounts them again. The managed commands start it when it is not running,
so it rarely needs starting by hand.

One daemon per state root: a second one exits 4 (busy). In the background
(the default) it logs to STATE/daemon.log and the command returns once it
answers.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "foreground", Usage: "serve in this process, logging to stderr"},
		},
		OnUsageError: onUsageError,
		Action:       runDaemon,
	}
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
	if err := startDaemon(root); err != nil {
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
	// Catch signals before mounting (see serve).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	m, err := manager.New(manager.Options{StateRoot: root, Mount: true, Logger: logger})
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
	s := <-sigs
	logger.Info("daemon stopping", "signal", s.String())
	_ = srv.Close()
	if err := m.Close(); err != nil {
		return fmt.Errorf("close the manager: %w", err)
	}
	logger.Info("daemon stopped")
	return nil
}
