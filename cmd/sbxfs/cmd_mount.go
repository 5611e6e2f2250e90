package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/fuse"
	"github.com/sbxfs/sbxfs/layers"
)

func mountCommand() *cli.Command {
	return &cli.Command{
		Name:      "mount",
		Usage:     "show ORIGINAL at MOUNTPOINT, keeping every change in a private upper layer",
		ArgsUsage: "ORIGINAL MOUNTPOINT",
		Description: `Mounts a sandbox of the directory ORIGINAL at the empty directory MOUNTPOINT.
Reads come from ORIGINAL; every change lands in the sandbox directory DIR
(DIR/upper, with DIR/work for the journal and the server log) and ORIGINAL
is never written. Without --upper, DIR is a new directory under the state
root and its path is printed ("upper: DIR"). Giving the same --upper again
remounts the same changes.

The command returns once the mount is live; the mount is served by a
background process logging to DIR/work/server.log. Options go before
ORIGINAL and MOUNTPOINT. Undo it with 'sbxfs unmount MOUNTPOINT'.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "upper", Usage: "sandbox directory `DIR` holding upper/ and work/ (created, or reused when it exists)"},
			&cli.BoolFlag{Name: "foreground", Usage: "serve in this process until unmounted or interrupted"},
			&cli.BoolFlag{Name: "allow-other", Usage: "let other users use the mount (permission checks apply; needs user_allow_other in /etc/fuse.conf for non-root)"},
			&cli.BoolFlag{Name: "debug", Usage: "log every FUSE request"},
			&cli.BoolFlag{Name: "no-passthrough", Usage: "do not use FUSE passthrough for upper files"},
			&cli.BoolFlag{Name: "json", Usage: "once the mount is live, print {mountpoint, original, sandbox, upper, work} as JSON"},
		},
		OnUsageError: onUsageError,
		Action:       runMount,
	}
}

func runMount(c *cli.Context) error {
	args := c.Args().Slice()
	if err := checkArgs(c, args, 2, "ORIGINAL MOUNTPOINT"); err != nil {
		return err
	}
	mounts, err := readMountinfo()
	if err != nil {
		return err
	}
	orig, err := resolveDir("original", args[0], "give an existing directory")
	if err != nil {
		return err
	}
	mnt, err := checkMountpoint(mounts, args[1])
	if err != nil {
		return err
	}
	dir, generated, err := sandboxDir(c.String("upper"), c.String("state-dir"))
	if err != nil {
		return err
	}
	upper, work := sandboxDirs(dir)
	lay := layout{mountpoint: mnt, lowers: []string{orig}, upper: upper, work: work}
	if err := lay.check(); err != nil {
		return err
	}
	if err := checkSandboxFree(mounts, work); err != nil {
		return err
	}
	if err := makeSandbox(dir); err != nil {
		return err
	}
	if err := checkWorkFiles(work); err != nil {
		return err
	}
	cfg := layers.Config{Upper: upper, Work: work, Lowers: []string{orig}}
	if err := bindLayers(&cfg); err != nil {
		return err
	}
	spec := &mountSpec{cfg: fuse.Config{
		Layers:        cfg,
		Mountpoint:    mnt,
		FsName:        work,
		AllowOther:    c.Bool("allow-other"),
		NoPassthrough: c.Bool("no-passthrough"),
		Debug:         c.Bool("debug"),
	}}
	if generated {
		spec.announce = "upper: " + dir
	}
	if c.Bool("json") {
		b, err := json.Marshal(mountResult{Mountpoint: mnt, Original: orig, Sandbox: dir, Upper: upper, Work: work})
		if err != nil {
			return err
		}
		spec.announce = string(b)
	}
	if c.Bool("foreground") {
		err = serve(spec, c.App.Writer)
	} else if err = startBackground(mountChildArgs(c, dir, orig, mnt), serverLog(work)); err == nil && spec.announce != "" {
		fmt.Fprintln(c.App.Writer, spec.announce)
	}
	if err != nil && generated && !spec.live {
		_ = os.RemoveAll(dir) // a mount that never went live leaves no sandbox behind
	}
	return err
}

// mountResult is what `mount --json` prints once the mount is live.
type mountResult struct {
	Mountpoint string `json:"mountpoint"`
	Original   string `json:"original"`
	Sandbox    string `json:"sandbox"` // the --upper directory
	Upper      string `json:"upper"`
	Work       string `json:"work"`
}

// sandboxDir returns the resolved sandbox directory: the one given with
// --upper, or a new name under the state root.
func sandboxDir(flag, stateDir string) (dir string, generated bool, err error) {
	if flag == "" {
		root, err := stateRoot(stateDir)
		if err != nil {
			return "", false, err
		}
		if flag, err = newSandboxPath(root); err != nil {
			return "", false, err
		}
		generated = true
	}
	dir, err = resolvePath(flag)
	if err != nil {
		return "", false, failf(exitBadPath, "sandbox directory %q: %v; give an absolute path", flag, err)
	}
	return dir, generated, nil
}

// mountChildArgs is the argv of the background server: the same mount in
// the foreground form, with every path resolved.
func mountChildArgs(c *cli.Context, dir, orig, mnt string) []string {
	args := []string{"sbxfs"}
	if sd := c.String("state-dir"); sd != "" {
		args = append(args, "--state-dir", sd)
	}
	args = append(args, "mount", "--foreground", "--upper", dir)
	for _, f := range []string{"allow-other", "debug", "no-passthrough"} {
		if c.Bool(f) {
			args = append(args, "--"+f)
		}
	}
	return append(args, "--", orig, mnt)
}

// checkArgs refuses a wrong number of positional arguments, with a hint
// for options placed after them.
func checkArgs(c *cli.Context, args []string, n int, usage string) error {
	for _, a := range args {
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			return failf(exitUsage, "option %q after the arguments; put options before %s (see 'sbxfs help %s')", a, usage, c.Command.Name)
		}
	}
	if len(args) != n {
		return failf(exitUsage, "%s needs %s, got %d argument(s); see 'sbxfs help %s'", c.Command.Name, usage, len(args), c.Command.Name)
	}
	for i, a := range args {
		// filepath.Abs("") is the working directory: an empty argument
		// (an unset shell variable) must not stand for it.
		if a == "" {
			return failf(exitUsage, "argument %d of %s is empty; give %s", i+1, c.Command.Name, usage)
		}
	}
	return nil
}

// onUsageError turns a flag parsing error into a usage exit.
func onUsageError(c *cli.Context, err error, isSubcommand bool) error {
	help := "sbxfs help"
	if isSubcommand && c.Command != nil {
		help += " " + c.Command.Name
	}
	return failf(exitUsage, "%v; see '%s'", err, help)
}
