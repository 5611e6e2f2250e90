// Command sbxfs mounts sandboxes of directories: a FUSE overlay that shows
// an original directory, keeps every change in a private upper layer and
// records every mutation in a journal.
//
// Usage:
//
//	sbxfs [--state-dir DIR] mount [--upper DIR] [--foreground] [--allow-other] [--debug] [--no-passthrough] [--no-io-uring] ORIGINAL MOUNTPOINT
//	sbxfs [--state-dir DIR] mount [--json] ID|MOUNTPOINT    (a managed sandbox, mounted again by its daemon)
//	sbxfs unmount [--lazy] MOUNTPOINT
//	sbxfs status [--json] [MOUNTPOINT|DIR|ID]
//	sbxfs diff [--stat|--name-status|--json] [MOUNTPOINT|DIR|ID]
//	sbxfs commit|rollback|resolve ... MOUNTPOINT|DIR|ID
//	sbxfs create|list|run|destroy|gc|daemon ...   (managed sandboxes: see 'sbxfs help')
//	mount -t fuse.sbxfs sbxfs MOUNTPOINT -o lowerdir=A[:B...],upperdir=U,workdir=W
//
// Exit codes are listed in exitcodes.go.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/fsutil"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if spec, ok := os.LookupEnv(inPlaceEnv); ok {
		os.Exit(inPlaceExec(spec, os.Args[1:], os.Stderr)) // becomes CMD of 'sbxfs run --in-place'
	}
	closeStrayFds()
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// run runs the command line argv and returns the exit code. Commands
// return errors; only here are they turned into a message and a code.
func run(argv []string, stdout, stderr io.Writer) int {
	ready = takeReadyPipe()
	app := newApp(stdout, stderr)
	commands := map[string]bool{}
	for _, c := range app.Commands {
		for _, n := range c.Names() {
			commands[n] = true
		}
	}
	commands["help"], commands["h"] = true, true
	var err error
	if len(argv) > 0 && isHelperInvocation(argv[0], argv[1:], commands) {
		err = runHelper(argv[1:])
	} else {
		err = app.Run(argv)
	}
	if err != nil && fsutil.NeedProc() != nil {
		// Whatever failed, the cause to fix is the missing /proc (the
		// mount table, descriptors' names and the layers need it).
		err = failf(exitInternal, "%v (%v)", fsutil.ErrNoProc, err)
	}
	code := exitCode(err)
	if err != nil {
		msg := err.Error()
		var ee *exitError
		if !errors.As(err, &ee) && code == exitUsage {
			msg += "; run 'sbxfs help' for the commands and their options"
		}
		fmt.Fprintf(stderr, "sbxfs: %s\n", msg)
		ready.fail(code, msg)
	}
	return code
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "sbxfs",
		Usage:     "work in a sandbox of a directory: every change stays private until you decide",
		UsageText: "sbxfs [--state-dir DIR] COMMAND [OPTIONS] ARGS...\n" + helperUsage,
		Description: `sbxfs mount shows ORIGINAL at MOUNTPOINT; everything written there lands in
the sandbox directory and ORIGINAL is never changed. 'sbxfs status' lists
the changes, 'sbxfs commit' applies them to ORIGINAL atomically, 'sbxfs
rollback' discards them, 'sbxfs unmount' ends the mount (the changes stay).

Mount helper form: with /sbin/mount.fuse.sbxfs linked to sbxfs
(scripts/install.sh), mount(8) and /etc/fstab mount sandboxes as
  mount -t fuse.sbxfs sbxfs MNT -o lowerdir=ORIG,upperdir=U,workdir=W
lowerdir may list several layers, top first (A:B:C); workdir must be on
the file system of upperdir. The generic options (rw, defaults, noauto,
nofail, _netdev, user, x-*, allow_other, dev, suid, ...) are accepted; ro
is refused. In this form, as root, allow_other is on; 'sbxfs mount' lets
other users in only with --allow-other.

State root (for sandboxes made without --upper): --state-dir, else
$SBXFS_STATE_DIR, else /var/lib/sbxfs for root, else
$XDG_STATE_HOME/sbxfs or ~/.local/state/sbxfs.

Exit codes: 0 ok, 1 internal error, 2 usage, 3 bad path, 4 busy or
already mounted, 5 mount failed, 6 not an sbxfs mount or sandbox,
7 commit refused by conflicts, 8 commit failed, 9 diff --exit-code found
changes, 10 the sandbox's state forbids the operation. 'sbxfs run' exits
with its command's status.`,
		Version: buildVersion(),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "state-dir", Usage: "keep new sandboxes under `DIR`"},
		},
		Commands: []*cli.Command{mountCommand(), unmountCommand(), statusCommand(),
			withManagedCommit(commitCommand()), withManagedRollback(rollbackCommand()), recoverCommand(), resolveCommand(), diffCommand(),
			createCommand(), listCommand(), destroyCommand(), gcCommand(), runCommand(), daemonCommand()},
		Action:         rootAction,
		OnUsageError:   onUsageError,
		ExitErrHandler: func(*cli.Context, error) {}, // main reports errors
		Writer:         stdout,
		ErrWriter:      stderr,
	}
}

// rootAction runs when no subcommand matched.
func rootAction(c *cli.Context) error {
	if c.Args().Present() {
		return failf(exitUsage, "unknown command %q; run 'sbxfs help' for the commands", c.Args().First())
	}
	_ = cli.ShowAppHelp(c)
	return failf(exitUsage, "no command given; run 'sbxfs help'")
}

// buildVersion is the version with the module version or VCS revision
// the binary was built from, when known.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version
	}
	if v := bi.Main.Version; version == "dev" && v != "" && v != "(devel)" {
		return v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return version + "+" + s.Value[:12]
		}
	}
	return version
}
