package manager

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
)

// The daemon socket is tested in process with Options{Mount: false}: no
// mount is served, so the test may change the sandboxes itself. The CLI's
// tests run the real daemon as a separate process.

// serveDaemon serves m on its state root until the test ends and returns
// a connected client.
func serveDaemon(t *testing.T, m *Manager) (*DaemonServer, *Daemon) {
	t.Helper()
	s, err := ServeDaemon(m, m.StateRoot())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	d, err := DialDaemon(m.StateRoot())
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return s, d
}

// longRoot is a state root whose socket path does not fit in sun_path.
func longRoot(t *testing.T) string {
	root := t.TempDir()
	for len(root) < 150 {
		root = filepath.Join(root, strings.Repeat("d", 30))
	}
	return root
}

func TestDaemonCreateListCommit(t *testing.T) {
	m := open(t, longRoot(t))
	s, d := serveDaemon(t, m)
	st, err := os.Stat(s.Path())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the socket is private")
	assert.Equal(t, os.Getpid(), d.Pid)

	fx := &fixture{m: m, root: m.StateRoot(), plan: "p"}
	for i := range 2 {
		orig := makeTree(t, fixtureFiles)
		sb, err := d.Create(CreateOptions{Plan: "p", Original: orig, Name: "n"})
		require.NoError(t, err)
		assert.Equal(t, Active, sb.State)
		assert.Equal(t, "n", sb.Name)
		assert.True(t, KnownSandbox(m.StateRoot(), sb.ID))
		fx.origs, fx.ids, fx.old = append(fx.origs, orig), append(fx.ids, sb.ID), append(fx.old, snapshot(t, orig))
		fx.change(t, i)
	}
	list, err := d.List("p")
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, fx.ids[0], list[0].ID)
	assert.Equal(t, m.List("p")[1], list[1], "the client sees what the manager knows")
	got, err := d.Get(fx.ids[1])
	require.NoError(t, err)
	assert.Equal(t, fx.origs[1], got.Original)

	res, err := d.Commit(Target{Plan: "p"}, CommitOptions{Message: "m"})
	require.NoError(t, err)
	assert.Equal(t, fx.ids, res.Committed)
	fx.allNew(t)
	assert.Equal(t, repeat(Committed, 2), fx.states(t, m))

	_, err = d.Commit(Target{ID: fx.ids[0]}, CommitOptions{})
	assert.ErrorIs(t, err, ErrNotActive, "a committed sandbox does not commit again")
	assert.Equal(t, CodeIllegalMove, ErrorCode(err))
	var pe *PlanError
	require.ErrorAs(t, err, &pe)
}

func TestDaemonConflictKeepsEveryOriginal(t *testing.T) {
	m := open(t, t.TempDir())
	_, d := serveDaemon(t, m)
	fx := newFixture(t, m, "p", 2)
	require.NoError(t, os.WriteFile(filepath.Join(fx.origs[1], "f"), []byte("changed underneath"), 0o644))
	fx.old[1] = snapshot(t, fx.origs[1])

	res, err := d.Commit(Target{Plan: "p"}, CommitOptions{})
	require.Error(t, err)
	assert.ErrorIs(t, err, commit.ErrConflict)
	assert.Equal(t, CodeConflict, ErrorCode(err))
	var pe *PlanError
	require.ErrorAs(t, err, &pe)
	assert.Same(t, res, pe.Result())
	assert.Empty(t, res.Committed)
	assert.ElementsMatch(t, fx.ids, res.RolledBack)
	assert.Equal(t, "p", res.Plan)
	assert.Equal(t, 1, strings.Count(err.Error(), "commit plan p"), "the message is not repeated: %v", err)
	fx.allOld(t)
	assert.Equal(t, repeat(Active, 2), fx.states(t, m), "both stay active, retryable")

	res, err = d.Commit(Target{Plan: "p"}, CommitOptions{Force: true})
	require.NoError(t, err)
	assert.Len(t, res.Committed, 2)
}

func TestDaemonRollbackDestroyGC(t *testing.T) {
	m := open(t, t.TempDir())
	_, d := serveDaemon(t, m)
	fx := newFixture(t, m, "p", 2)

	res, err := d.Rollback(Target{Plan: "p"}, true)
	require.NoError(t, err)
	assert.ElementsMatch(t, fx.ids, res.Done)
	assert.Equal(t, repeat(Active, 2), fx.states(t, m), "keep: active and empty")
	res, err = d.Rollback(Target{ID: fx.ids[0]}, false)
	require.NoError(t, err)
	assert.Equal(t, []string{fx.ids[0]}, res.Done)
	fx.allOld(t)

	for range 2 {
		res, err = d.Destroy(Target{ID: fx.ids[1]})
		require.NoError(t, err, "destroy twice is fine")
		assert.Equal(t, []string{fx.ids[1]}, res.Done)
	}
	assert.Equal(t, []State{RolledBack, CleanedUp}, fx.states(t, m))
	res, err = d.Destroy(Target{Plan: "p"})
	require.NoError(t, err)
	assert.Equal(t, []string{fx.ids[0]}, res.Done, "the rolled back one is cleaned up too")
	assert.Equal(t, repeat(CleanedUp, 2), fx.states(t, m))
	_, err = d.GC()
	require.NoError(t, err)
}

func TestDaemonErrors(t *testing.T) {
	m := open(t, t.TempDir())
	_, d := serveDaemon(t, m)
	unknown := "0123456789abcdef"

	_, err := d.Get(unknown)
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Equal(t, CodeNotFound, ErrorCode(err))
	res, err := d.Destroy(Target{ID: unknown})
	assert.ErrorIs(t, err, ErrNotFound)
	var be *BatchError
	require.ErrorAs(t, err, &be)
	assert.Same(t, res, be.Result())
	require.Len(t, res.Failed, 1)
	assert.Equal(t, unknown, res.Failed[0].ID)
	assert.ErrorIs(t, res.Failed[0], ErrNotFound)

	_, err = d.Create(CreateOptions{Original: filepath.Join(t.TempDir(), "missing")})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = d.Commit(Target{}, CommitOptions{})
	assert.ErrorIs(t, err, ErrInvalid, "a commit needs an id or a plan")
	_, err = d.Rollback(Target{ID: unknown, Plan: "p"}, false)
	assert.ErrorIs(t, err, ErrInvalid, "not both")

	for req, code := range map[string]string{`{"op":"frob"}`: CodeInvalid, `not json`: CodeInvalid} {
		assert.Equal(t, code, rawCall(t, m.StateRoot(), req).Code, req)
	}
}

// rawCall sends one line to the daemon socket and decodes the answer.
func rawCall(t *testing.T, root, line string) daemonResponse {
	t.Helper()
	p, done, err := sockPath(root, DaemonSocket)
	require.NoError(t, err)
	defer done()
	conn, err := net.Dial("unix", p)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte(line + "\n"))
	require.NoError(t, err)
	var resp daemonResponse
	require.NoError(t, json.NewDecoder(bufio.NewReader(conn)).Decode(&resp))
	return resp
}

func TestDaemonClose(t *testing.T) {
	m := open(t, t.TempDir())
	// A socket left by a dead daemon is replaced.
	require.NoError(t, os.WriteFile(filepath.Join(m.StateRoot(), DaemonSocket), nil, 0o600))
	s, d := serveDaemon(t, m)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close twice is fine")
	assert.NoFileExists(t, s.Path())
	_, err := d.Ping()
	assert.ErrorIs(t, err, ErrDaemonGone, "the connection ends with the server")
	_, err = DialDaemon(m.StateRoot())
	assert.ErrorIs(t, err, ErrNoDaemon)
}

// The stop request is answered, then StopRequested is closed (the
// daemon's owner stops as on SIGTERM); unmount asks the manager.
func TestDaemonStopAndUnmountRequests(t *testing.T) {
	m := open(t, t.TempDir())
	s, d := serveDaemon(t, m)
	fx := newFixture(t, m, "p", 1)

	require.NoError(t, d.Unmount(fx.ids[0], false), "a sandbox nobody mounts: nothing to do")
	sb, err := m.Get(fx.ids[0])
	require.NoError(t, err)
	assert.Equal(t, Active, sb.State, "it stays active")
	err = d.Unmount("0123456789abcdef", false)
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Equal(t, CodeInvalid, rawCall(t, m.StateRoot(), `{"op":"unmount"}`).Code, "unmount needs an id")
	_, err = d.Destroy(Target{ID: fx.ids[0]})
	require.NoError(t, err)
	assert.ErrorIs(t, d.Unmount(fx.ids[0], false), ErrNotActive)

	select {
	case <-s.StopRequested():
		t.Fatal("stop requested before any stop request")
	default:
	}
	require.NoError(t, d.Stop())
	select {
	case <-s.StopRequested():
	case <-time.After(5 * time.Second):
		t.Fatal("a stop request does not reach the daemon's owner")
	}
	_, err = d.Ping()
	assert.NoError(t, err, "the server answers until its owner closes it")
}

// TestErrorCodeOfAConflictWhileRead: a commit refused because its looks
// met the original changing (a symlink on the way) has a code of its own,
// which a client still matches as a conflict; one real conflict among
// them makes it a plain conflict.
func TestErrorCodeOfAConflictWhileRead(t *testing.T) {
	whileRead := commit.Conflict{Path: "d/f", Reason: commit.ReasonChangedWhileRead}
	other := commit.Conflict{Path: "g", Reason: "content changed in the original"}
	plan := func(cs ...commit.Conflict) error {
		return (*PlanError)(&PlanResult{Plan: "p", Err: &commit.Error{Stage: commit.StageApply, Conflicts: cs, Err: commit.ErrConflict}})
	}
	assert.Equal(t, CodeChangedWhileRead, ErrorCode(plan(whileRead)))
	assert.Equal(t, CodeConflict, ErrorCode(plan(whileRead, other)))
	assert.ErrorIs(t, &DaemonError{Code: CodeChangedWhileRead, Msg: "m"}, commit.ErrConflict)
}

// The commit refusals that name a path of the original to fix have codes
// of their own, which a client matches as the same errors.
func TestErrorCodesOfBadPaths(t *testing.T) {
	otherMount := (*PlanError)(&PlanResult{Plan: "p", Err: &commit.Error{Stage: commit.StagePrepare, Err: fmt.Errorf("%w: sub/f", commit.ErrOtherMount)}})
	assert.Equal(t, CodeOtherMount, ErrorCode(otherMount))
	assert.ErrorIs(t, &DaemonError{Code: CodeOtherMount, Msg: "m"}, commit.ErrOtherMount)
	missing := fmt.Errorf("prepare sandbox x: %w: /o is not there", ErrOriginalMissing)
	assert.Equal(t, CodeOriginalMissing, ErrorCode(missing))
	assert.ErrorIs(t, &DaemonError{Code: CodeOriginalMissing, Msg: "m"}, ErrOriginalMissing)
}

// The system error beneath a failure crosses the socket: a client matches
// the daemon's failure with errors.Is(err, unix.EROFS) as its own.
func TestErrnoOfAFailure(t *testing.T) {
	roFS := (*PlanError)(&PlanResult{Plan: "p", Err: &commit.Error{Stage: commit.StagePrepare,
		Err: &os.PathError{Op: "mkdir", Path: "/o/.sbxfs-txn-1", Err: unix.EROFS}}})
	assert.Equal(t, "EROFS", ErrnoName(roFS))
	assert.Equal(t, "", ErrnoName(ErrNotFound))
	de := &DaemonError{Code: CodeFailed, Msg: "m", Errno: ErrnoName(roFS)}
	assert.ErrorIs(t, de, unix.EROFS)
	assert.NotErrorIs(t, de, unix.EPERM)
	assert.NotErrorIs(t, &DaemonError{Code: CodeFailed, Msg: "m"}, unix.EROFS)
	assert.Equal(t, "EROFS", ErrnoName(fmt.Errorf("commit plan p: %w", de)), "a client's error names it too")
	f := FailureInfos([]Failure{{ID: "x", Err: roFS}})[0].failure()
	assert.ErrorIs(t, f.Err, unix.EROFS, "and a failure in a batch")
}
