package main

import (
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/manager"
)

func createCommand() *cli.Command {
	return &cli.Command{
		Name:      "create",
		Usage:     "make a managed sandbox of ORIGINAL, mounted by the daemon",
		ArgsUsage: "ORIGINAL [MOUNTPOINT]",
		Description: `Makes a sandbox of the directory ORIGINAL in plan P (default "default") and
mounts it at MOUNTPOINT (an empty directory), or at STATE/mnt/<id> when
none is given. Prints the sandbox id and its mountpoint, tab-separated.
The sandbox is served by the daemon of the state root, started when it is
not running. Commit every sandbox of a plan at once, all or nothing, with
'sbxfs commit --plan P'.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "plan", Usage: "put the sandbox in plan `P`"},
			&cli.StringFlag{Name: "name", Usage: "describe the sandbox as `NAME` (free text)"},
			&cli.BoolFlag{Name: "json", Usage: "print the sandbox as JSON"},
		},
		OnUsageError: onUsageError,
		Action:       runCreate,
	}
}

func runCreate(c *cli.Context) error {
	args := c.Args().Slice()
	if err := checkArgs(c, args, min(max(len(args), 1), 2), "ORIGINAL [MOUNTPOINT]"); err != nil {
		return err
	}
	o := manager.CreateOptions{Plan: c.String("plan"), Name: c.String("name")}
	var err error
	if o.Original, err = filepath.Abs(args[0]); err != nil {
		return failf(exitBadPath, "original %q: %v; give an absolute path", args[0], err)
	}
	if len(args) == 2 {
		if o.Mountpoint, err = filepath.Abs(args[1]); err != nil {
			return failf(exitBadPath, "mountpoint %q: %v; give an absolute path", args[1], err)
		}
	}
	o.Original = daemonPath(o.Original) // as the daemon sees it (run --in-place)
	if o.Mountpoint != "" {
		o.Mountpoint = daemonPath(o.Mountpoint)
	}
	return withDaemon(c, func(d *manager.Daemon, root string) error {
		sb, err := d.Create(o)
		if err != nil {
			return daemonFailure(err, root, exitMountFailed)
		}
		if !seenHere(sb) {
			fmt.Fprintf(c.App.ErrWriter, "sbxfs: warning: %s\n", notSeenHere(sb))
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, manager.Info(sb))
		}
		fmt.Fprintf(c.App.Writer, "%s\t%s\n", sb.ID, sb.Mountpoint)
		return nil
	})
}
