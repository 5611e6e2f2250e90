package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
	"github.com/sbxfs/sbxfs/manager"
)

func commitCommand() *cli.Command {
	return &cli.Command{
		Name:      "commit",
		Usage:     "apply the sandbox's changes to its original, atomically",
		ArgsUsage: "MOUNTPOINT|DIR",
		Description: `Applies every change of the sandbox to the original: all of them or, on any
failure, none. A path the original changed after the sandbox first changed
it is a conflict: nothing is applied (--force applies anyway). What another
writer changes in the original while the commit runs, where the commit
replaces or removes something, undoes the commit: a conflict too, also with
--force (exit 7; nothing is lost). While the commit runs the mount accepts no
changes; files still open for writing make it fail (busy), or wait with
--wait. Afterwards the sandbox is unmounted and
removed; with --keep it stays mounted over the updated original, empty, and
so does a mount still in use (a shell's working directory in it), with a
warning. A change on a filesystem mounted inside the original cannot be
committed (exit 3; rename(2) does not cross mounts), nor can a sandbox over
several lower layers (exit 3: its original is their merged view, which no
one directory holds; its upper can be stacked as a lower layer instead).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "message", Aliases: []string{"m"}, Usage: "commit `MSG`, kept in the commit record (and the git commit with --git)"},
			&cli.BoolFlag{Name: "keep", Usage: "stay mounted over the updated original, with an empty sandbox"},
			&cli.BoolFlag{Name: "force", Usage: "apply despite conflicts"},
			&cli.DurationFlag{Name: "wait", Usage: "wait up to `DURATION` for files open for writing to close", Action: nonNegativeWait},
			&cli.BoolFlag{Name: "git", Usage: "also make a git commit (message from -m) of exactly the committed paths, when the original is a git work tree (a renamed directory's files are recorded as renamed; FIFOs, sockets and devices are left out)"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
		},
		OnUsageError: onUsageError,
		Action:       runCommit,
	}
}

// commitRecord is kept in the work directory after a commit with --keep,
// and printed by --json.
type commitRecord struct {
	ID        string          `json:"id"`
	Message   string          `json:"message,omitempty"`
	GitCommit string          `json:"git_commit,omitempty"`
	Time      time.Time       `json:"time"`
	Changes   []layers.Change `json:"changes"`
}

const commitRecordName = "last-commit.json"

func runCommit(c *cli.Context) error {
	args := c.Args().Slice()
	if err := checkArgs(c, args, 1, "MOUNTPOINT|DIR"); err != nil {
		return err
	}
	sb, err := openSandbox(args[0], c.App.ErrWriter)
	if err != nil {
		return err
	}
	if err := sb.needOriginal(); err != nil {
		return err
	}
	if len(sb.cfg.Lowers) > 1 {
		return severalLowers(commit.ErrSeveralLowers, sb)
	}
	if c.Bool("git") {
		if c.String("message") == "" {
			return failf(exitUsage, "--git needs a commit message: give -m MSG")
		}
		if err := commit.CheckGitWorkTree(sb.meta.Lowers[0]); err != nil {
			return failf(exitBadPath, "--git: %v; nothing was committed", err)
		}
	}
	ctl, err := sb.control()
	if err != nil {
		return err
	}
	if ctl != nil {
		defer closeControl(ctl) // thaws the mount if anything below fails
	}
	if err := freeze(ctl, c.Duration("wait")); err != nil {
		return err
	}
	x, err := commit.Prepare(sb.cfg, commit.Options{Message: c.String("message"), Force: c.Bool("force")})
	if err != nil {
		return journalHint(commitFailure(err), sb.work)
	}
	if err := commit.Commit(x); err != nil {
		return commitFailure(err)
	}
	rec := commitRecord{ID: x.ID(), Message: c.String("message"), Time: time.Now().UTC(), Changes: x.Changes()}
	if rec.Changes == nil {
		rec.Changes = []layers.Change{}
	}
	if c.Bool("git") && len(rec.Changes) > 0 {
		h, err := gitCommit(sb.meta.Lowers[0], rec.Changes, rec.Message)
		if err != nil {
			defer func() { _ = finishCommit(c, sb, ctl, &rec) }()
			return failf(exitCommitFailed, "the changes are committed to %s, but the git commit failed: %v; commit them with git", sb.meta.Lowers[0], err)
		}
		rec.GitCommit = h
	}
	if err := finishCommit(c, sb, ctl, &rec); err != nil {
		return err
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(rec)
	}
	fmt.Fprintf(c.App.Writer, "committed %d changes to %s\n", len(rec.Changes), sb.meta.Lowers[0])
	return nil
}

// gitCommit makes the git commit of --git: the changes committed to orig,
// with the message msg. It returns "" and no error when there is nothing
// for git to record (only the repository's own files changed, or a git
// commit made in the sandbox records them already).
func gitCommit(orig string, changes []layers.Change, msg string) (string, error) {
	paths, moves := commit.GitPaths(changes), commit.GitMoves(changes)
	if len(paths) == 0 && len(moves) == 0 {
		return "", nil
	}
	h, err := commit.GitCommit(orig, paths, commit.GitCommitOptions{Message: msg, Moves: moves, Replaced: commit.GitReplaced(changes)})
	if errors.Is(err, commit.ErrGitNothingToCommit) {
		return "", nil
	}
	return h, err
}

// finishCommit ends the sandbox after its commit: reset and kept, or
// unmounted and removed. A mount that is busy stays up, reset, with a
// warning: the commit itself is done.
func finishCommit(c *cli.Context, sb *sandbox, ctl *manager.Control, rec *commitRecord) error {
	keep := c.Bool("keep")
	if !keep && sb.end(ctl) != nil {
		fmt.Fprintf(c.App.ErrWriter, "sbxfs: committed, but %s is busy: it stays mounted over the updated original with an empty sandbox; unmount it when done\n", sb.mount.Mountpoint)
		keep = true
	}
	if !keep {
		return sb.discard()
	}
	if ctl != nil && sb.mount != nil {
		if err := resetMounted(ctl); err != nil {
			return fmt.Errorf("committed, but resetting the mount failed: %w; unmount and remount it", err)
		}
	} else if err := sb.resetOnDisk(); err != nil {
		return err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(sb.work, commitRecordName), b, 0o600)
}

// severalLowers is the error of a commit (or resolve) of a sandbox over
// several lower layers (commit.ErrSeveralLowers), with what to do.
func severalLowers(err error, sb *sandbox) error {
	return failf(exitBadPath, "%v; nothing was applied: its changes stay in %s, an overlay upper layer ('sbxfs diff' shows them as a patch; a mount with lowerdir=%s:%s stacks them; 'sbxfs rollback' discards them)",
		err, sb.meta.Upper, sb.meta.Upper, strings.Join(sb.meta.Lowers, ":"))
}

// conflictHint says what to do about conflicts.
const conflictHint = "keep the sandbox's version of a path with 'sbxfs resolve MOUNTPOINT PATH...' (merge the original's change into the sandbox first to keep it too), or use --force for every path"

// whileReadHint is the hint for a conflict of the original changing while
// the commit read it (commit.Error.WhileRead).
const whileReadHint = "the original was changing while the commit read it: commit again once it is still"

// otherMountHint is the hint for commit.ErrOtherMount.
const otherMountHint = "a commit moves objects by rename(2), which does not cross mounts: make changes there in a sandbox of that mounted directory ('sbxfs rollback' discards this sandbox's changes)"

// commitFailure gives a commit error its exit code and a hint.
func commitFailure(err error) error {
	var ce *commit.Error
	switch {
	case errors.Is(err, commit.ErrConflict) && errors.As(err, &ce) && ce.RolledBack && ce.WhileRead():
		return &exitError{code: exitConflict, err: fmt.Errorf("%w\nthe commit was undone; %s", err, whileReadHint)}
	case errors.Is(err, commit.ErrConflict) && errors.As(err, &ce) && ce.RolledBack:
		// Found during the apply: someone wrote to the original while
		// the commit ran.
		return &exitError{code: exitConflict, err: fmt.Errorf("%w\nthe commit was undone; the next one names these as conflicts: %s", err, conflictHint)}
	case errors.Is(err, commit.ErrConflict) && errors.As(err, &ce) && ce.WhileRead():
		return &exitError{code: exitConflict, err: fmt.Errorf("%w\nnothing was applied; %s", err, whileReadHint)}
	case errors.Is(err, commit.ErrConflict):
		return &exitError{code: exitConflict, err: fmt.Errorf("%w\nnothing was applied; %s", err, conflictHint)}
	case errors.Is(err, commit.ErrBusy):
		return &exitError{code: exitBusy, err: err}
	case errors.Is(err, commit.ErrSeveralLowers):
		return &exitError{code: exitBadPath, err: err}
	case errors.Is(err, commit.ErrOtherMount):
		return &exitError{code: exitBadPath, err: fmt.Errorf("%w\nnothing was applied; %s", err, otherMountHint)}
	case errors.As(err, &ce) && ce.Kept != "":
		return &exitError{code: exitCommitFailed, err: fmt.Errorf("%w\nsome changes could not be undone: the backups are in %s", err, ce.Kept)}
	case errors.As(err, &ce) && fsHint(err) != "" && ce.Stage == commit.StagePrepare:
		return &exitError{code: exitCommitFailed, err: fmt.Errorf("%w\nnothing was applied; %s", err, fsHint(err))}
	case errors.As(err, &ce) && fsHint(err) != "" && ce.RolledBack:
		return &exitError{code: exitCommitFailed, err: fmt.Errorf("%w\n%s", err, fsHint(err))}
	case errors.As(err, &ce):
		return &exitError{code: exitCommitFailed, err: err}
	}
	return err
}

// fsHint says what to do about a failure a file system gave sbxfs
// (read-only, full, not permitted), "" for any other failure. The sandbox
// keeps its changes through all of them.
// nonNegativeWait refuses a negative --wait (a typo, not a wish).
func nonNegativeWait(_ *cli.Context, d time.Duration) error {
	if d < 0 {
		return failf(exitUsage, "--wait %v is negative; give a duration of 0 or more (0: do not wait)", d)
	}
	return nil
}

func fsHint(err error) string {
	const retry = "; then retry: the sandbox keeps its changes"
	switch {
	case errors.Is(err, unix.EROFS):
		return "the file system named is mounted read-only: remount it read-write ('mount -o remount,rw')" + retry
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return "the file system named is full or a quota is reached: free space" + retry
	case (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)) && os.Geteuid() == 0:
		return "the file or directory named, or the one it is in, may be immutable or append-only: 'lsattr -d PATH' shows it, 'chattr -i -a PATH' clears it" + retry
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return "you may not change the file or directory named: run as a user who may" + retry
	}
	return ""
}
