package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"
)

// Exit codes of the sbxfs command. Scripts may rely on them: never change
// the meaning of a number, only add new ones.
//
//	code  meaning
//	0     success
//	1     internal error: anything not listed below
//	2     usage: bad arguments, unknown flag, subcommand or mount option
//	3     bad input path: original missing or not a directory, mountpoint
//	      missing, not a directory or not empty, directories nested in one
//	      another, an upper made for another original; a commit or
//	      resolve of a change on a filesystem mounted inside the
//	      original, or of a sandbox over several lower layers
//	4     busy: mountpoint already mounted, sandbox already mounted or
//	      served (also 'sbxfs mount ID' of a mounted managed sandbox, or
//	      of one nested in a sandbox that is not mounted), unmount
//	      refused because files are open
//	5     mount failed: the kernel or fusermount3 refused the mount, or the
//	      server did not come up
//	6     not an sbxfs mount or sandbox directory
//	7     commit refused: the original changed underneath the sandbox
//	      (conflicts are listed; nothing was applied)
//	8     commit failed; the message says what was undone, and where the
//	      backups are kept when something could not be
//	9     'sbxfs diff --exit-code': the sandbox has changes (git uses 1,
//	      which here already means an internal error)
//	10    a managed sandbox is in a state that forbids the operation (it
//	      was committed, rolled back or destroyed: see 'sbxfs list')
//
// 'sbxfs run' exits with the status of its command (128+N when a signal
// N killed it) once the sandbox is committed or rolled back; the codes
// above when sbxfs itself fails.
const (
	exitOK           = 0
	exitInternal     = 1
	exitUsage        = 2
	exitBadPath      = 3
	exitBusy         = 4
	exitMountFailed  = 5
	exitNotSbxfs     = 6
	exitConflict     = 7
	exitCommitFailed = 8
	exitChanges      = 9
	exitState        = 10
)

// exitError is an error that carries the exit code main must use. Its
// message follows the form "what happened; what to do".
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// failf returns an exitError with a formatted message. %w works as in
// fmt.Errorf.
func failf(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

// exitCode tells which exit code err stands for.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ce cli.ExitCoder
	if errors.As(err, &ce) {
		// urfave/cli's own errors ("No help topic for ...") are usage errors.
		return exitUsage
	}
	return exitInternal
}
