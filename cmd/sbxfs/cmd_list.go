package main

import (
	"bufio"
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/manager"
)

func listCommand() *cli.Command {
	return &cli.Command{
		Name:  "list",
		Usage: "list the managed sandboxes",
		Description: `Lists the managed sandboxes of the state root (of plan P with --plan), every
state included, oldest first: id, plan, state, whether the daemon serves
its mount, original, mountpoint and name. Destroyed sandboxes stay listed
as cleaned-up.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "plan", Usage: "only the sandboxes of plan `P`"},
			&cli.BoolFlag{Name: "json", Usage: "print a JSON array"},
		},
		OnUsageError: onUsageError,
		Action:       runList,
	}
}

func runList(c *cli.Context) error {
	if err := checkArgs(c, c.Args().Slice(), 0, "no arguments"); err != nil {
		return err
	}
	return withDaemon(c, func(d *manager.Daemon, root string) error {
		sbs, err := d.List(c.String("plan"))
		if err != nil {
			return daemonFailure(err, root, exitInternal)
		}
		if c.Bool("json") {
			out := make([]manager.SandboxInfo, 0, len(sbs))
			for _, sb := range sbs {
				out = append(out, manager.Info(sb))
			}
			return printJSON(c.App.Writer, out)
		}
		out := bufio.NewWriter(c.App.Writer) // tabwriter writes cell by cell
		tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPLAN\tSTATE\tMOUNTED\tORIGINAL\tMOUNTPOINT\tNAME")
		for _, sb := range sbs {
			mounted := "no"
			if sb.Mounted {
				mounted = "yes"
			}
			name := "-" // none given ("." would read as a path)
			if sb.Name != "" {
				name = quotePath(sb.Name)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Plan, sb.State, mounted,
				quotePath(sb.Original), quotePath(sb.Mountpoint), name)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		return out.Flush()
	})
}
