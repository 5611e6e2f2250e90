package main

import (
	"encoding/json"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/commit"
)

func rollbackCommand() *cli.Command {
	return &cli.Command{
		Name:      "rollback",
		Usage:     "discard the sandbox's changes",
		ArgsUsage: "MOUNTPOINT|DIR",
		Description: `Discards every change of the sandbox; the original is untouched. The sandbox
is unmounted and removed; with --keep it stays mounted, empty, for re-use. A
mount still in use (a file open, a working directory in it) cannot be ended:
the rollback then does nothing (exit 4); close what uses it, or use --keep.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "keep", Usage: "stay mounted with an empty sandbox"},
			&cli.DurationFlag{Name: "wait", Usage: "with --keep: wait up to `DURATION` for files open for writing to close", Action: nonNegativeWait},
		},
		OnUsageError: onUsageError,
		Action:       runRollback,
	}
}

func runRollback(c *cli.Context) error {
	args := c.Args().Slice()
	if err := checkArgs(c, args, 1, "MOUNTPOINT|DIR"); err != nil {
		return err
	}
	sb, err := openSandbox(args[0], c.App.ErrWriter)
	if err != nil {
		return err
	}
	ctl, err := sb.control()
	if err != nil {
		return err
	}
	if ctl != nil {
		defer closeControl(ctl)
	}
	if !c.Bool("keep") {
		if err := sb.end(ctl); err != nil {
			if exitCode(err) == exitBusy {
				return failf(exitBusy, "%v; nothing was rolled back: close what uses it and retry, or use --keep to empty the sandbox and stay mounted", err)
			}
			return err
		}
		if err := sb.discard(); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "rolled back; %s is unchanged\n", sb.meta.Lowers[0])
		return nil
	}
	if err := commit.ForgetBases(sb.work); err != nil {
		return err
	}
	if ctl == nil {
		return sb.resetOnDisk()
	}
	if err := freeze(ctl, c.Duration("wait")); err != nil {
		return err
	}
	if err := resetMounted(ctl); err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "rolled back; %s is mounted with an empty sandbox\n", sb.mount.Mountpoint)
	return nil
}

func recoverCommand() *cli.Command {
	return &cli.Command{
		Name:      "recover",
		Usage:     "finish or undo an interrupted commit",
		ArgsUsage: "MOUNTPOINT|DIR",
		Description: `A commit interrupted before its commit point is undone (the original is as
before and the sandbox keeps its changes); one interrupted after it is
finished (the original has every change). Every other command does this
first too.`,
		Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"}},
		OnUsageError: onUsageError,
		Action:       runRecover,
	}
}

func runRecover(c *cli.Context) error {
	args := c.Args().Slice()
	if err := checkArgs(c, args, 1, "MOUNTPOINT|DIR"); err != nil {
		return err
	}
	sb, err := lookupSandbox(args[0])
	if err != nil {
		return err
	}
	rec, err := commit.Recover(sb.cfg, commit.RecoverOptions{})
	if err != nil {
		return commitFailure(err)
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(rec)
	}
	if rec.Action == "none" {
		fmt.Fprintln(c.App.Writer, "no interrupted commit")
		return nil
	}
	fmt.Fprintf(c.App.Writer, "interrupted commit %s %s\n", rec.ID, rec.Action)
	return nil
}
