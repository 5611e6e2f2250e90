package main

import (
	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/manager"
)

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "purge what abandoned managed sandboxes left behind",
		Description: `Removes sandbox directories without a record, the leftovers of committed,
rolled back and broken sandboxes, stale mounts of the state root whose
server is gone, and unused mountpoints under STATE/mnt. Prints each purged
item; failures are reported and the rest goes on. Nothing that may hold
the only backups of an original (an undo log) is removed.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
		},
		OnUsageError: onUsageError,
		Action:       runGC,
	}
}

func runGC(c *cli.Context) error {
	if err := checkArgs(c, c.Args().Slice(), 0, "no arguments"); err != nil {
		return err
	}
	return withDaemon(c, func(d *manager.Daemon, root string) error {
		res, err := d.GC()
		return printBatch(c, res, err, root, "purged")
	})
}
