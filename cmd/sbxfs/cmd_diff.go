package main

import (
	"encoding/json"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

func diffCommand() *cli.Command {
	return &cli.Command{
		Name:      "diff",
		Usage:     "show the changes of a sandbox as a patch",
		ArgsUsage: "[MOUNTPOINT|DIR|ID]",
		Description: `Prints the changes of the sandbox as a git-style unified patch against
its original: diff --git headers, new/deleted file mode, old/new mode,
rename from/to, "Binary files ... differ" (with --binary, git's binary
patch), hunks with -U N lines of context (default 3). A symlink's
content is its target. A renamed directory shows as a rename of every
file it moves, as in git. Where git has no form the patch says it in
words, on lines git apply passes over: "new directory P" and "deleted
directory P" for a directory no other change lies beneath, "renamed
directory A -> B", "new fifo P" (socket, device), "mode changed P OLD
-> NEW" for a directory or one of those, "metadata changed P" for an
owner, time or xattr change. Modes are the real file modes (100640
stays 100640). The patch applies with git apply (binary files need
--binary) to a copy of the original and gives the sandbox's files.

--stat prints git diff --stat lines and a summary; --name-status prints
A/M/D/T/m PATH and R FROM PATH lines (m: metadata only, T: type change);
--json prints per change the paths, kind, types, modes, sizes, symlink
targets, binary flag and added/deleted line counts. As the patch, these
forms name each file a renamed directory moves (R d/f e/f) and each
original file a change drops that no entry names (D), in path order;
--json marks them with "implied_by", the path of the entry they follow
from. The sandbox is named as for 'sbxfs status'. Only the changed paths
are read (and, for a renamed, removed or replaced directory, the
original's listings beneath it).

The exit code is 0 whether or not there are changes; with --exit-code
it is 9 when there are changes (git uses 1, which sbxfs uses for internal errors).`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "stat", Usage: "print a diffstat"},
			&cli.BoolFlag{Name: "name-status", Usage: "print one status letter and path per change"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			&cli.IntFlag{Name: "unified", Aliases: []string{"U"}, Value: 3, Usage: "`N` lines of context"},
			&cli.BoolFlag{Name: "binary", Usage: "write binary files' content as git's binary patch (git diff --binary)"},
			&cli.BoolFlag{Name: "exit-code", Usage: "exit with 9 when there are changes"},
		},
		OnUsageError: onUsageError,
		Action:       runDiff,
	}
}

// diffJSON is the --json output.
type diffJSON struct {
	Original string            `json:"original"`
	Upper    string            `json:"upper"`
	Work     string            `json:"work"`
	Changes  []commit.FileDiff `json:"changes"`
	// The exact bytes of the paths above that are not valid UTF-8.
	OriginalB64 string `json:"original_b64,omitempty"`
	UpperB64    string `json:"upper_b64,omitempty"`
	WorkB64     string `json:"work_b64,omitempty"`
}

func runDiff(c *cli.Context) error {
	args, err := argsOrHere(c)
	if err != nil {
		return err
	}
	forms := 0
	for _, f := range []string{"stat", "name-status", "json"} {
		if c.Bool(f) {
			forms++
		}
	}
	if forms > 1 {
		return failf(exitUsage, "--stat, --name-status and --json exclude one another; give one")
	}
	if c.Int("unified") < 0 {
		return failf(exitUsage, "-U %d: the context must be 0 or more lines; give -U 0 for none", c.Int("unified"))
	}
	sb, cs, err := sandboxChanges(c, args[0])
	if err != nil {
		return err
	}
	if err := printDiff(c, sb.cfg, sb.meta.Lowers[0], cs); err != nil {
		return fmt.Errorf("diff of %s: %w", sb.work, err)
	}
	if c.Bool("exit-code") && len(cs.Changes) > 0 {
		return failf(exitChanges, "the sandbox has %d change(s) (--exit-code)", len(cs.Changes))
	}
	return nil
}

// printDiff prints the changes cs of cfg in the form asked for; orig is
// the original's path to name (cfg may read it elsewhere: uncover).
func printDiff(c *cli.Context, cfg layers.Config, orig string, cs layers.ChangeSet) error {
	w := c.App.Writer
	switch {
	case c.Bool("stat"):
		return commit.DiffStat(w, cfg, cs)
	case c.Bool("name-status"):
		return commit.NameStatusWithTypes(w, cfg, cs)
	case c.Bool("json"):
		files, err := commit.DiffJSON(cfg, cs)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(diffJSON{Original: orig, Upper: cfg.Upper, Work: cfg.Work, Changes: files,
			OriginalB64: fsutil.B64IfInvalid(orig), UpperB64: fsutil.B64IfInvalid(cfg.Upper), WorkB64: fsutil.B64IfInvalid(cfg.Work)})
	}
	context := c.Int("unified")
	if context == 0 {
		context = -1 // DiffOptions: 0 is the default, negative is none
	}
	return commit.Diff(w, cfg, cs, commit.DiffOptions{Context: context, Binary: c.Bool("binary")})
}
