package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/manager"
)

// The managed commands (create, list, commit --plan, rollback --plan,
// destroy, gc, run) talk to the daemon of the state root over
// StateRoot/daemon.sock, starting it in the background when none answers.

// daemonStartTimeout bounds the wait for a daemon another command is
// starting at the same time.
const daemonStartTimeout = 10 * time.Second

// managedRoot is the state root of the managed commands.
func managedRoot(c *cli.Context) (string, error) {
	return stateRoot(c.String("state-dir"))
}

// connectDaemon connects to the daemon of root, starting it when none
// answers, and says so on w. Another process may hold the state root for
// a while (a daemon starting or stopping): it retries for
// daemonStartTimeout.
func connectDaemon(root string, w io.Writer) (*manager.Daemon, error) {
	if d, err := manager.DialDaemon(root); err == nil {
		return d, nil
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, failf(exitBadPath, "state root %s: %v; check --state-dir", root, err)
	}
	deadline := time.Now().Add(daemonStartTimeout)
	var startErr error
	var started time.Time
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		if started.IsZero() || (startErr != nil && time.Since(started) > time.Second) {
			started = time.Now()
			startErr = startDaemon(root)
			if startErr != nil && exitCode(startErr) != exitBusy {
				return nil, startErr
			}
		}
		d, err := manager.DialDaemon(root)
		if err == nil {
			if startErr == nil {
				fmt.Fprintf(w, "sbxfs: started the daemon of %s (pid %d, log %s)\n", root, d.Pid, daemonLog(root))
			}
			return d, nil
		}
		if time.Now().After(deadline) {
			if startErr != nil {
				return nil, failf(exitBusy, "%v; and no daemon answers on %s: stop that process", startErr, manager.DaemonSocketPath(root))
			}
			return nil, failf(exitInternal, "the daemon started but does not answer: %v; see %s", err, daemonLog(root))
		}
		time.Sleep(delay)
	}
}

// startDaemon starts the daemon of root in the background, with the
// daemon command's flags, and waits until it answers or has failed (exit
// 4 when another process holds the state root).
func startDaemon(root string, flags ...string) error {
	return startBackground(append([]string{"sbxfs", "--state-dir", root, "daemon", "--foreground"}, flags...), daemonLog(root))
}

// withDaemon runs f with a connection to the daemon of the state root.
func withDaemon(c *cli.Context, f func(d *manager.Daemon, root string) error) error {
	root, err := managedRoot(c)
	if err != nil {
		return err
	}
	d, err := connectDaemon(root, c.App.ErrWriter)
	if err != nil {
		return err
	}
	defer d.Close()
	return f(d, root)
}

// daemonFailure gives a failure the daemon reported its exit code (other
// is the code of a failure of no particular kind) and a hint.
func daemonFailure(err error, root string, other int) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, manager.ErrDaemonGone) {
		return failf(exitInternal, "%w; what became of the request is settled by the next daemon: see 'sbxfs list' and %s", err, daemonLog(root))
	}
	switch manager.ErrorCode(err) {
	case manager.CodeNotFound:
		return failf(exitNotSbxfs, "%w; see 'sbxfs list'", err)
	case manager.CodeBusy:
		return failf(exitBusy, "%w; close the files or processes using the sandbox, or retry", err)
	case manager.CodeConflict:
		return failf(exitConflict, "%w\nno original was changed; %s", err, conflictHint)
	case manager.CodeChangedWhileRead:
		return failf(exitConflict, "%w\nno original was changed; %s", err, whileReadHint)
	case manager.CodeIllegalMove:
		return failf(exitState, "%w; see 'sbxfs list' for its state", err)
	case manager.CodeInvalid:
		return failf(exitBadPath, "%w; check the arguments", err)
	case manager.CodeOriginalMissing:
		return failf(exitBadPath, "%w; if it was moved, record its new place with 'sbxfs mount --moved NEWPLACE ID'", err)
	case manager.CodeOtherMount:
		return failf(exitBadPath, "%w\nno original was changed; %s", err, otherMountHint)
	}
	if h := fsHint(err); h != "" {
		return failf(other, "%w; see %s\n%s", err, daemonLog(root), h)
	}
	return failf(other, "%w; see %s", err, daemonLog(root))
}

// daemonLog is where the background daemon writes its log.
func daemonLog(root string) string { return filepath.Join(root, "daemon.log") }

// printJSON prints v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// planJSON is the --json output of a managed commit.
type planJSON struct {
	Plan           string                `json:"plan"`
	Committed      []string              `json:"committed"`
	RolledBack     []string              `json:"rolled_back"`
	RollbackFailed []manager.FailureInfo `json:"rollback_failed"`
	StillMounted   []string              `json:"still_mounted"`
	GitCommits     map[string]string     `json:"git_commits,omitempty"` // --git: sandbox id -> commit
	Error          string                `json:"error,omitempty"`
	Code           string                `json:"code,omitempty"`
	Errno          string                `json:"errno,omitempty"`
}

func toPlanJSON(res *manager.PlanResult) planJSON {
	j := planJSON{Plan: res.Plan, Committed: nonNil(res.Committed), RolledBack: nonNil(res.RolledBack),
		RollbackFailed: manager.FailureInfos(res.RollbackFailed), StillMounted: nonNil(res.StillMounted)}
	if res.Err != nil {
		j.Error, j.Code, j.Errno = res.Err.Error(), manager.ErrorCode(res.Err), manager.ErrnoName(res.Err)
	}
	return j
}

// batchJSON is the --json output of rollback, destroy and gc.
type batchJSON struct {
	Op     string                `json:"op"`
	Done   []string              `json:"done"`
	Failed []manager.FailureInfo `json:"failed"`
	Error  string                `json:"error,omitempty"`
	Code   string                `json:"code,omitempty"`
	Errno  string                `json:"errno,omitempty"`
}

func toBatchJSON(res *manager.BatchResult) batchJSON {
	j := batchJSON{Op: res.Op, Done: nonNil(res.Done), Failed: manager.FailureInfos(res.Failed)}
	if res.Err != nil {
		j.Error, j.Code, j.Errno = res.Err.Error(), manager.ErrorCode(res.Err), manager.ErrnoName(res.Err)
	}
	return j
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// printBatch prints a rollback, destroy or gc result (JSON, or a line per
// sandbox done) and returns its failure (err) with its exit code.
func printBatch(c *cli.Context, res *manager.BatchResult, err error, root, verb string) error {
	if c.Bool("json") {
		if perr := printJSON(c.App.Writer, toBatchJSON(res)); perr != nil {
			return perr
		}
	} else {
		for _, id := range res.Done {
			fmt.Fprintf(c.App.Writer, "%s %s\n", verb, id)
		}
	}
	if err == nil || len(res.Failed) == 0 {
		return daemonFailure(err, root, exitInternal)
	}
	msg := fmt.Sprintf("%s: %v", res.Op, res.Failed[0].Err)
	if len(res.Failed) > 1 {
		var fs []string
		for _, f := range res.Failed {
			fs = append(fs, fmt.Sprintf("%s: %v", f.ID, f.Err))
		}
		msg = fmt.Sprintf("%s: %d failed: %s", res.Op, len(res.Failed), strings.Join(fs, "; "))
	}
	return daemonFailure(&causeError{msg: msg, err: err}, root, exitInternal)
}

// causeError is err with another message.
type causeError struct {
	msg string
	err error
}

func (e *causeError) Error() string { return e.msg }
func (e *causeError) Unwrap() error { return e.err }

// batchTarget is the sandbox ID argument or --plan P of rollback and
// destroy.
func batchTarget(c *cli.Context) (manager.Target, error) {
	args := c.Args().Slice()
	if plan := c.String("plan"); plan != "" {
		if err := checkArgs(c, args, 0, "--plan P or an ID, not both"); err != nil {
			return manager.Target{}, err
		}
		return manager.Target{Plan: plan}, nil
	}
	if err := checkArgs(c, args, 1, "ID or --plan P"); err != nil {
		return manager.Target{}, err
	}
	if !manager.ValidID(args[0]) {
		return manager.Target{}, failf(exitUsage, "%q is not a sandbox id (16 hex digits); see 'sbxfs list'", args[0])
	}
	return manager.Target{ID: args[0]}, nil
}

// withManagedCommit makes the commit command also commit managed
// sandboxes through the daemon: a plan (--plan P), a sandbox ID, or the
// mountpoint of a managed sandbox. Any other MOUNTPOINT|DIR keeps the
// standalone path.
func withManagedCommit(cmd *cli.Command) *cli.Command {
	cmd.ArgsUsage = "MOUNTPOINT|DIR|ID | --plan P"
	cmd.Description += `

Managed sandboxes ('sbxfs create') commit through the daemon: --plan P
commits every active sandbox of the plan, all of them or none; an ID (or
the mountpoint of a managed sandbox) commits that one. Exit 7 on a
conflict: no original is changed and every sandbox stays mounted with its
changes (fix and retry, or --force). With --git each committed sandbox's
original gets a git commit of exactly the paths its commit changed
(every original must lie in a git work tree: checked first).`
	cmd.Flags = append(cmd.Flags, &cli.StringFlag{Name: "plan", Usage: "commit every active sandbox of plan `P`, all or nothing (managed)"})
	standalone := cmd.Action
	cmd.Action = func(c *cli.Context) error {
		root, t, err := managedTarget(c)
		if err != nil || (t == manager.Target{}) {
			if err == nil {
				err = standalone(c)
			}
			return err
		}
		if c.Bool("git") && c.String("message") == "" {
			return failf(exitUsage, "--git needs a commit message: give -m MSG")
		}
		d, err := connectDaemon(root, c.App.ErrWriter)
		if err != nil {
			return err
		}
		defer d.Close()
		if c.Bool("git") {
			if err := checkGitTargets(d, t); err != nil {
				return err
			}
		}
		o := manager.CommitOptions{Message: c.String("message"), Force: c.Bool("force"), Keep: c.Bool("keep"), Wait: c.Duration("wait")}
		res, err := d.Commit(t, o)
		failed := daemonFailure(err, root, exitCommitFailed)
		var hashes map[string]string
		var gitErr error
		if failed == nil && c.Bool("git") {
			hashes, gitErr = gitCommitApplied(res.Applied, o.Message)
		}
		return printCommit(c, res, failed, hashes, gitErr)
	}
	return cmd
}

// checkGitTargets refuses --git, before anything is committed, when the
// original of a sandbox the commit of t would take is not in a git work
// tree.
func checkGitTargets(d *manager.Daemon, t manager.Target) error {
	sbs, err := d.List(t.Plan)
	if err != nil {
		return failf(exitInternal, "--git: list the sandboxes: %v", err)
	}
	for _, sb := range sbs {
		if (t.ID != "" && sb.ID != t.ID) || sb.State != manager.Active {
			continue
		}
		if err := commit.CheckGitWorkTree(sb.Original); err != nil {
			return failf(exitBadPath, "--git: the original of %s: %v; nothing was committed", sb.ID, err)
		}
	}
	return nil
}

// gitCommitApplied makes a git commit with the message msg of exactly the
// paths each sandbox's commit changed in its original (as the standalone
// commit --git does) and returns each one's commit by sandbox id.
func gitCommitApplied(applied []manager.Applied, msg string) (map[string]string, error) {
	hashes := map[string]string{}
	for _, a := range applied {
		h, err := gitCommit(a.Original, a.Changes, msg)
		if err != nil {
			return hashes, failf(exitCommitFailed, "the changes of %s are committed to %s, but the git commit failed: %v; commit them with git", a.ID, a.Original, err)
		}
		if h != "" {
			hashes[a.ID] = h
		}
	}
	return hashes, nil
}

// printCommit prints a managed commit's result and the git commits --git
// made; failed is the commit's error, gitErr that of the git commits
// after it.
func printCommit(c *cli.Context, res *manager.PlanResult, failed error, hashes map[string]string, gitErr error) error {
	if c.Bool("json") {
		j := toPlanJSON(res)
		j.GitCommits = hashes
		if err := printJSON(c.App.Writer, j); err != nil {
			return err
		}
		return errors.Join(failed, gitErr)
	}
	if failed != nil {
		return failed
	}
	if len(res.Committed) == 0 {
		fmt.Fprintf(c.App.Writer, "nothing to commit in plan %s\n", res.Plan)
		return nil
	}
	for _, id := range res.Committed {
		if h, ok := hashes[id]; ok {
			fmt.Fprintf(c.App.Writer, "committed %s (git commit %s)\n", id, h)
		} else {
			fmt.Fprintf(c.App.Writer, "committed %s\n", id)
		}
	}
	for _, id := range res.StillMounted {
		fmt.Fprintf(c.App.ErrWriter, "sbxfs: committed, but the mount of %s is in use: it stays mounted over the updated original with an empty sandbox; unmount or destroy it when done\n", id)
	}
	return gitErr
}

// withManagedRollback is withManagedCommit for rollback.
func withManagedRollback(cmd *cli.Command) *cli.Command {
	cmd.ArgsUsage = "MOUNTPOINT|DIR|ID | --plan P"
	cmd.Description += `

Managed sandboxes ('sbxfs create') roll back through the daemon: --plan P
rolls back every active sandbox of the plan, an ID (or the mountpoint of a
managed sandbox) that one.`
	cmd.Flags = append(cmd.Flags,
		&cli.StringFlag{Name: "plan", Usage: "roll back every active sandbox of plan `P` (managed)"},
		&cli.BoolFlag{Name: "json", Usage: "print the result as JSON (managed)"})
	standalone := cmd.Action
	cmd.Action = func(c *cli.Context) error {
		root, t, err := managedTarget(c)
		switch {
		case err != nil:
			return err
		case t == manager.Target{} && c.Bool("json"):
			return failf(exitUsage, "--json works on managed sandboxes only (--plan P or an ID)")
		case t == manager.Target{}:
			return standalone(c)
		}
		d, err := connectDaemon(root, c.App.ErrWriter)
		if err != nil {
			return err
		}
		defer d.Close()
		res, err := d.Rollback(t, c.Bool("keep"))
		perr := printBatch(c, res, err, root, "rolled back")
		if manager.ErrorCode(err) == manager.CodeBusy && !c.Bool("keep") {
			return failf(exitBusy, "%w (or roll back with --keep: the sandbox is emptied and stays mounted for them)", perr)
		}
		return perr
	}
	return cmd
}

// managedTarget tells whether commit or rollback names a managed sandbox
// (--plan P; a sandbox ID of the state root that is not also a path; the
// mountpoint or directory of a managed sandbox) and the state root it
// belongs to. A zero Target means the standalone path.
func managedTarget(c *cli.Context) (string, manager.Target, error) {
	args := c.Args().Slice()
	root, err := managedRoot(c)
	if err != nil {
		return "", manager.Target{}, err
	}
	if plan := c.String("plan"); plan != "" {
		if err := checkArgs(c, args, 0, "--plan P or a sandbox, not both"); err != nil {
			return "", manager.Target{}, err
		}
		return root, manager.Target{Plan: plan}, nil
	}
	if len(args) != 1 {
		return "", manager.Target{}, nil // the standalone path reports it
	}
	arg := args[0]
	if _, err := os.Lstat(arg); manager.ValidID(arg) && errors.Is(err, os.ErrNotExist) {
		if !manager.KnownSandbox(root, arg) {
			return "", manager.Target{}, failf(exitNotSbxfs, "no sandbox %s in %s, and no such path; see 'sbxfs list'", arg, root)
		}
		return root, manager.Target{ID: arg}, nil
	}
	if r, id := managedSandboxAt(arg); id != "" {
		return r, manager.Target{ID: id}, nil
	}
	return "", manager.Target{}, nil
}

// managedSandboxAt returns the state root and id of the managed sandbox
// whose mountpoint or directory arg is, if it is one:
// its work directory is StateRoot/sandboxes/<id>/work.
func managedSandboxAt(arg string) (root, id string) {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return "", ""
	}
	work, err := findSandbox(mounts, arg)
	if err != nil {
		return "", ""
	}
	return managedWork(work)
}

// managedWork returns the state root and id of the managed sandbox whose
// work directory is work (StateRoot/sandboxes/<id>/work), if it is one.
func managedWork(work string) (root, id string) {
	if filepath.Base(work) != "work" {
		return "", ""
	}
	dir := filepath.Dir(work)
	id, sandboxes := filepath.Base(dir), filepath.Dir(dir)
	if filepath.Base(sandboxes) != "sandboxes" || !manager.KnownSandbox(filepath.Dir(sandboxes), id) {
		return "", ""
	}
	return filepath.Dir(sandboxes), id
}
