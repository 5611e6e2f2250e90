package main

import (
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/commit"
)

func resolveCommand() *cli.Command {
	return &cli.Command{
		Name:      "resolve",
		Usage:     "keep the sandbox's version of conflicting paths (or list the conflicts)",
		ArgsUsage: "MOUNTPOINT|DIR|ID [PATH...]",
		Description: `A conflict is a path the original changed after the sandbox first changed
it; 'sbxfs commit' refuses while there is one. 'sbxfs resolve MNT PATH...'
settles each PATH, as the conflicts name it (relative to the sandbox root;
a path inside MNT or the original works too), in the sandbox's favour: the
next commit replaces what the original has there now with the sandbox's
version, as --force would (a change of metadata alone is applied to the
original's file as it is now), and still refuses on every other conflict.
To keep the original's change as well, merge it into the sandbox's file
first (the original is at its own path; the mount shows the sandbox's),
then resolve. A change the original makes after the resolve is a conflict
again. Without PATH, lists the conflicts. Nothing in the original changes.

A directory the sandbox changed, or changed things in, that the original
removed, moved away or replaced by a file is made again by the commit, as
the sandbox has it. A conflict that keeping the sandbox's version cannot
settle (a symlink the original put on the way to it) is refused (exit 7):
put the original back as it was, use --force, or roll the sandbox back. A
PATH that names no conflict is refused (exit 3). Either way nothing is
recorded.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the conflicts resolved and those left as JSON"},
		},
		OnUsageError: onUsageError,
		Action:       runResolve,
	}
}

type resolveJSON struct {
	Resolved  []commit.Conflict `json:"resolved"`
	Conflicts []commit.Conflict `json:"conflicts"`
}

func runResolve(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) == 0 {
		return failf(exitUsage, "resolve needs MOUNTPOINT|DIR|ID [PATH...]; see 'sbxfs help resolve'")
	}
	if err := checkArgs(c, args[:1], 1, "MOUNTPOINT|DIR|ID [PATH...]"); err != nil {
		return err
	}
	for _, a := range args[1:] {
		if strings.HasPrefix(a, "-") {
			return failf(exitUsage, "%q after MOUNTPOINT|DIR is an option; put options before MOUNTPOINT|DIR and give each PATH as the conflicts name it (see 'sbxfs help resolve')", a)
		}
	}
	target, err := sandboxArg(c, args[0])
	if err != nil {
		return err
	}
	sb, err := openSandbox(target, c.App.ErrWriter)
	if err != nil {
		return err
	}
	if err := sb.needOriginal(); err != nil {
		return err
	}
	var paths []string
	for _, a := range args[1:] {
		p, err := sandboxRelative(sb, a)
		if err != nil {
			return err
		}
		paths = append(paths, p)
	}
	out := resolveJSON{Resolved: []commit.Conflict{}, Conflicts: []commit.Conflict{}}
	var left []commit.Conflict
	if len(paths) == 0 {
		left, err = commit.Conflicts(sb.cfg)
	} else {
		var resolved []commit.Conflict
		resolved, left, err = commit.Resolve(sb.cfg, paths)
		out.Resolved = append(out.Resolved, resolved...)
	}
	switch {
	case errors.Is(err, commit.ErrNotAConflict):
		return failf(exitBadPath, "%v; nothing was recorded (run 'sbxfs resolve %s' to list the conflicts)", err, args[0])
	case errors.Is(err, commit.ErrUnresolvable):
		return failf(exitConflict, "%v; nothing was recorded", err)
	case errors.Is(err, commit.ErrBusy):
		return failf(exitBusy, "%v; retry when it is done", err)
	case errors.Is(err, commit.ErrSeveralLowers):
		return severalLowers(err, sb)
	case err != nil:
		return journalHint(err, sb.work)
	}
	out.Conflicts = append(out.Conflicts, left...)
	if c.Bool("json") {
		return printJSON(c.App.Writer, out)
	}
	printResolve(c.App.Writer, out, args[0])
	return nil
}

func printResolve(w io.Writer, out resolveJSON, mnt string) {
	for _, r := range out.Resolved {
		fmt.Fprintf(w, "resolved %s (%s): the commit applies the sandbox's version of it\n", quotePath(r.Path), r.Reason)
	}
	if len(out.Conflicts) == 0 {
		fmt.Fprintf(w, "no conflicts: 'sbxfs commit %s' applies the changes\n", mnt)
		return
	}
	if len(out.Conflicts) == 1 {
		fmt.Fprintln(w, "1 conflict:")
	} else {
		fmt.Fprintf(w, "%d conflicts:\n", len(out.Conflicts))
	}
	for _, r := range out.Conflicts {
		fmt.Fprintf(w, "  %s: %s\n", quotePath(r.Path), r.Reason)
	}
}

// sandboxRelative turns a PATH argument into the sandbox-relative path
// conflicts are named by: as given when relative, or made relative to the
// mountpoint or the original when it is inside one of them.
func sandboxRelative(sb *sandbox, a string) (string, error) {
	if !filepath.IsAbs(a) {
		p := path.Clean(a)
		switch {
		case p == ".":
			return "", nil // the root, as status names it ("" in --json)
		case p == ".." || strings.HasPrefix(p, "../"):
			return "", failf(exitBadPath, "%q is not a path inside the sandbox; give it as the conflicts name it", a)
		}
		return p, nil
	}
	var roots []string
	if sb.mount != nil {
		roots = append(roots, sb.mount.Mountpoint)
	}
	roots = append(roots, sb.meta.Lowers[0])
	for _, root := range roots {
		if rel, err := filepath.Rel(root, filepath.Clean(a)); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			if rel == "." {
				rel = "" // the root
			}
			return rel, nil
		}
	}
	return "", failf(exitBadPath, "%s is not inside the sandbox's mountpoint or original; give the path as the conflicts name it", a)
}
