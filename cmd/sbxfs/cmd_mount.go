package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/fuse"
	"github.com/sbxfs/sbxfs/layers"
	"github.com/sbxfs/sbxfs/manager"
)

func mountCommand() *cli.Command {
	return &cli.Command{
		Name:      "mount",
		Usage:     "show ORIGINAL at MOUNTPOINT, keeping every change in a private upper layer (or mount a managed sandbox again)",
		ArgsUsage: "ORIGINAL MOUNTPOINT | ID|MOUNTPOINT | --moved NEWPLACE ID|MOUNTPOINT",
		Description: `Mounts a sandbox of the directory ORIGINAL at the empty directory MOUNTPOINT.
Reads come from ORIGINAL; every change lands in the sandbox directory DIR
(DIR/upper, with DIR/work for the journal and the server log) and ORIGINAL
is never written. Without --upper, DIR is a new directory under the state
root and its path is printed ("upper: DIR"). Giving the same --upper again
remounts the same changes; a mount of that sandbox whose server was killed
(stale) is detached first. A sandbox is bound to its original: if that
was moved, --moved --upper DIR NEWPLACE MOUNTPOINT records its new place
(only once nothing is left at the old one; each change is still checked
against the original at commit, so a copy conflicts where a move does not).

The command returns once the mount is live; the mount is served by a
background process logging to DIR/work/server.log. Options go before
ORIGINAL and MOUNTPOINT. Undo it with 'sbxfs unmount MOUNTPOINT'.

With one argument, the ID of a managed sandbox ('sbxfs create') or its
mountpoint, its daemon mounts that sandbox again at its recorded
mountpoint, with its changes: the undo of 'sbxfs unmount' without
restarting the daemon. The sandbox must be active (else exit 10) and not
mounted (else exit 4, "already mounted"); a sandbox nested in another
one mounts once that one is mounted (else exit 4: mount the parent
first). It prints ID<TAB>MOUNTPOINT, or the sandbox record with --json
(as 'sbxfs create --json'). --upper, --foreground, --allow-other,
--debug, --no-passthrough and --no-io-uring are for the standalone form
only.

With --moved and no --upper, NEWPLACE ID (or the sandbox's mountpoint)
records that the original of that managed sandbox was moved to NEWPLACE
and mounts the sandbox over it; it prints ID<TAB>MOUNTPOINT<TAB>NEWPLACE.
The sandbox must not be mounted (exit 4: unmount it first) and nothing
may be left at the old place (exit 3).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "upper", Usage: "sandbox directory `DIR` holding upper/ and work/ (created, or reused when it exists)"},
			&cli.BoolFlag{Name: "foreground", Usage: "serve in this process until unmounted or interrupted"},
			&cli.BoolFlag{Name: "allow-other", Usage: "let other users use the mount (permission checks apply; needs user_allow_other in /etc/fuse.conf for non-root)"},
			&cli.BoolFlag{Name: "debug", Usage: "log every FUSE request"},
			&cli.BoolFlag{Name: "no-passthrough", Usage: "do not use FUSE passthrough for upper files"},
			&cli.BoolFlag{Name: "no-io-uring", Usage: "take the kernel's requests from /dev/fuse even where the kernel offers io_uring (fuse module parameter enable_uring)"},
			&cli.BoolFlag{Name: "moved", Usage: "the sandbox's original was moved to ORIGINAL (or NEWPLACE, for a managed sandbox): record its new place (the old place must be gone)"},
			&cli.BoolFlag{Name: "json", Usage: "once the mount is live, print {mountpoint, original, sandbox, upper, work} as JSON (managed: the sandbox record)"},
		},
		OnUsageError: onUsageError,
		Action:       runMount,
	}
}

// mountUsage is what mount takes, for its usage errors.
const mountUsage = "ORIGINAL MOUNTPOINT, or the ID or MOUNTPOINT of a managed sandbox"

func runMount(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) == 1 {
		return runMountManaged(c, args[0])
	}
	if err := checkArgs(c, args, 2, mountUsage); err != nil {
		return err
	}
	if c.Bool("moved") && c.String("upper") == "" {
		return runMovedManaged(c, args[0], args[1])
	}
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return err
	}
	if c.String("upper") != "" {
		if dir, err := resolvePath(c.String("upper")); err == nil {
			_, work := sandboxDirs(dir)
			if mounts, err = detachStale(mounts, work, c.App.ErrWriter); err != nil {
				return err
			}
		}
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
	if _, err := os.Lstat(dir); c.Bool("moved") && err != nil {
		return failf(exitNotSbxfs, "--moved: no sandbox at %s (%v); give the --upper DIR of the sandbox whose original was moved", dir, err)
	}
	if err := makeSandbox(dir); err != nil {
		return err
	}
	if err := checkWorkFiles(work); err != nil {
		return err
	}
	cfg := layers.Config{Upper: upper, Work: work, Lowers: []string{orig}}
	if c.Bool("moved") {
		if err := rebindLayers(&cfg); err != nil {
			return err
		}
	}
	if err := bindLayers(&cfg); err != nil {
		return err
	}
	spec := &mountSpec{cfg: fuse.Config{
		Layers:        cfg,
		Mountpoint:    mnt,
		FsName:        work,
		AllowOther:    c.Bool("allow-other"),
		NoPassthrough: c.Bool("no-passthrough"),
		NoIOUring:     c.Bool("no-io-uring"),
		Debug:         c.Bool("debug"),
	}}
	if generated {
		spec.announce = "upper: " + dir
	}
	if c.Bool("json") {
		b, err := json.Marshal(mountResult{Mountpoint: mnt, Original: orig, Sandbox: dir, Upper: upper, Work: work,
			MountpointB64: fsutil.B64IfInvalid(mnt), OriginalB64: fsutil.B64IfInvalid(orig), SandboxB64: fsutil.B64IfInvalid(dir),
			UpperB64: fsutil.B64IfInvalid(upper), WorkB64: fsutil.B64IfInvalid(work)})
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

// standaloneMountFlags are the mount flags of the two-argument form only.
var standaloneMountFlags = []string{"upper", "moved", "foreground", "allow-other", "debug", "no-passthrough", "no-io-uring"}

// runMountManaged is 'sbxfs mount ID|MOUNTPOINT': the daemon of the
// sandbox's state root mounts that active, unmounted sandbox again at its
// recorded mountpoint.
func runMountManaged(c *cli.Context, arg string) error {
	if err := checkArgs(c, []string{arg}, 1, mountUsage); err != nil {
		return err
	}
	if c.Bool("moved") {
		return failf(exitUsage, "--moved takes the original's new place and the sandbox: 'sbxfs mount --moved NEWPLACE ID'")
	}
	for _, f := range standaloneMountFlags {
		if c.IsSet(f) {
			return failf(exitUsage, "--%s is for a standalone mount (ORIGINAL MOUNTPOINT); a managed sandbox mounts again as it was created", f)
		}
	}
	root, id, err := managedMountTarget(c, arg)
	if err != nil {
		return err
	}
	d, err := manager.DialDaemon(root)
	started := err != nil
	if started {
		if d, err = connectDaemon(root, c.App.ErrWriter); err != nil {
			return err
		}
	}
	defer d.Close()
	sb, err := d.Mount(id)
	if err != nil && started && manager.ErrorCode(err) == manager.CodeBusy {
		// A daemon that starts mounts every active sandbox itself: the
		// sandbox asked for is mounted, as asked.
		if got, gerr := d.Get(id); gerr == nil && got.State == manager.Active && got.Mounted {
			sb, err = got, nil
		}
	}
	switch code := manager.ErrorCode(err); {
	case err == nil:
	case code == manager.CodeBusy:
		// Already mounted, or nested in a sandbox that is not: the message
		// says which, and what to do.
		return failf(exitBusy, "%w", err)
	case code == manager.CodeInvalid:
		return failf(exitBadPath, "%w; a managed sandbox mounts at its recorded mountpoint only, an empty directory (see 'sbxfs list')", err)
	default:
		return daemonFailure(err, root, exitMountFailed)
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, manager.Info(sb))
	}
	fmt.Fprintf(c.App.Writer, "%s\t%s\n", sb.ID, sb.Mountpoint)
	return nil
}

// runMovedManaged is 'sbxfs mount --moved NEWPLACE ID|MOUNTPOINT': the
// daemon records NEWPLACE as the new place of the managed sandbox's moved
// original and mounts the sandbox there.
func runMovedManaged(c *cli.Context, newPlace, arg string) error {
	for _, f := range standaloneMountFlags {
		if f != "moved" && c.IsSet(f) {
			return failf(exitUsage, "--%s is for a standalone mount; 'mount --moved NEWPLACE ID' records a managed sandbox's new original and mounts it as it was created", f)
		}
	}
	orig, err := resolveDir("new place of the original", newPlace, "give the directory the original was moved to")
	if err != nil {
		return err
	}
	root, id, err := managedMountTarget(c, arg)
	if err != nil {
		return failf(exitUsage, "--moved: %s names no managed sandbox (%v); for a standalone sandbox, --moved names the sandbox with --upper DIR: 'sbxfs mount --moved --upper DIR NEWPLACE MOUNTPOINT'", arg, err)
	}
	d, err := connectDaemon(root, c.App.ErrWriter)
	if err != nil {
		return err
	}
	defer d.Close()
	sb, err := d.Moved(id, orig)
	if err != nil {
		return daemonFailure(err, root, exitMountFailed)
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, manager.Info(sb))
	}
	fmt.Fprintf(c.App.Writer, "%s\t%s\t%s\n", sb.ID, sb.Mountpoint, sb.Original)
	return nil
}

// managedMountTarget finds the managed sandbox the one argument of mount
// names, without asking a daemon: a sandbox ID of the state root (that is
// not also a path), or a recorded mountpoint (mounted or not; the
// manager's own STATE/mnt/<id> also of another state root). It returns
// the sandbox's state root and id.
func managedMountTarget(c *cli.Context, arg string) (root, id string, err error) {
	if root, err = managedRoot(c); err != nil {
		return "", "", err
	}
	if _, lerr := os.Lstat(arg); manager.ValidID(arg) && errors.Is(lerr, os.ErrNotExist) {
		if !manager.KnownSandbox(root, arg) {
			return "", "", failf(exitNotSbxfs, "no sandbox %s in %s, and no such path; see 'sbxfs list'", arg, root)
		}
		return root, arg, nil
	}
	mnt, err := resolvePath(arg)
	if err != nil {
		return "", "", failf(exitBadPath, "%q: %v; give a sandbox ID or a mountpoint", arg, err)
	}
	// Mounted: the mount's source names its sandbox and state root.
	if mounts, err := fsutil.ReadMountinfo(); err == nil {
		if e := fsutil.MountAt(mounts, mnt); e != nil && isSbxfs(e) {
			if r, id := managedWork(e.Source); id != "" {
				return r, id, nil
			}
		}
	}
	roots := []string{root}
	if filepath.Base(filepath.Dir(mnt)) == "mnt" {
		roots = append(roots, filepath.Dir(filepath.Dir(mnt))) // STATE/mnt/<id>
	}
	for _, r := range roots {
		if id, ok := manager.SandboxAtMountpoint(r, mnt); ok {
			return r, id, nil
		}
	}
	if _, serr := os.Stat(mnt); errors.Is(serr, os.ErrNotExist) {
		return "", "", failf(exitBadPath, "%s does not exist, and no managed sandbox of %s has it as its mountpoint; give %s (see 'sbxfs list')", mnt, root, mountUsage)
	}
	return "", "", failf(exitUsage, "%s is not the mountpoint of a managed sandbox of %s; 'sbxfs mount' takes %s (see 'sbxfs help mount')", mnt, root, mountUsage)
}

// mountResult is what `mount --json` prints once the mount is live.
type mountResult struct {
	Mountpoint string `json:"mountpoint"`
	Original   string `json:"original"`
	Sandbox    string `json:"sandbox"` // the --upper directory
	Upper      string `json:"upper"`
	Work       string `json:"work"`
	// The exact bytes of the paths above that are not valid UTF-8.
	MountpointB64 string `json:"mountpoint_b64,omitempty"`
	OriginalB64   string `json:"original_b64,omitempty"`
	SandboxB64    string `json:"sandbox_b64,omitempty"`
	UpperB64      string `json:"upper_b64,omitempty"`
	WorkB64       string `json:"work_b64,omitempty"`
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
	for _, f := range []string{"allow-other", "debug", "no-passthrough", "no-io-uring"} {
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
