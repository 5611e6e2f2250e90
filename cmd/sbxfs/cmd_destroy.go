package main

import (
	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/manager"
)

func destroyCommand() *cli.Command {
	return &cli.Command{
		Name:      "destroy",
		Usage:     "discard a managed sandbox (or every sandbox of a plan) and its changes",
		ArgsUsage: "ID | --plan P",
		Description: `Unmounts the sandbox (lazily when files are still open), removes its
directories and its changes, and leaves it listed as cleaned-up. The
original is untouched. Destroying a destroyed sandbox is fine. A sandbox
holding an interrupted commit that cannot be settled is refused: its undo
log and backups are kept.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "plan", Usage: "destroy every sandbox of plan `P`"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
		},
		OnUsageError: onUsageError,
		Action:       runDestroy,
	}
}

func runDestroy(c *cli.Context) error {
	t, err := batchTarget(c)
	if err != nil {
		return err
	}
	return withDaemon(c, func(d *manager.Daemon, root string) error {
		res, err := d.Destroy(t)
		return printBatch(c, res, err, root, "destroyed")
	})
}
