package manager

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
)

// ErrNoDaemon says no daemon answers on the state root's socket.
var ErrNoDaemon = errors.New("no sbxfs daemon answers")

// ErrDaemonGone says the daemon went away in the middle of a request:
// what became of the request is unknown until the next daemon settles it.
var ErrDaemonGone = errors.New("the sbxfs daemon went away")

// DaemonError is a failure the daemon reported: its message and what kind
// it is (Code). errors.Is matches it with the error the code stands for
// (ErrNotFound, commit.ErrConflict, commit.ErrBusy, ErrIllegalMove,
// ErrInvalid, ...) and with the system error beneath it (Errno, as
// "EROFS"; unix.EROFS matches).
type DaemonError struct {
	Code  string
	Msg   string
	Errno string
}

func (e *DaemonError) Error() string { return e.Msg }

// Is matches the error e's code stands for.
func (e *DaemonError) Is(target error) bool {
	if en, ok := target.(unix.Errno); ok {
		return e.Errno != "" && unix.ErrnoName(en) == e.Errno
	}
	switch e.Code {
	case CodeNotFound:
		return target == ErrNotFound
	case CodeConflict, CodeChangedWhileRead:
		return target == commit.ErrConflict
	case CodeBusy:
		return target == commit.ErrBusy
	case CodeIllegalMove:
		return target == ErrIllegalMove || target == ErrNotActive
	case CodeInvalid:
		return target == ErrInvalid
	case CodeOriginalMissing:
		return target == ErrOriginalMissing
	case CodeOtherMount:
		return target == commit.ErrOtherMount
	}
	return false
}

// Target names what an operation acts on: one sandbox (ID) or every
// sandbox of a plan (Plan).
type Target struct {
	ID, Plan string
}

// Daemon is a connection to the daemon of a state root. Its methods may
// be called from several goroutines (one request at a time).
type Daemon struct {
	mu   sync.Mutex
	conn net.Conn
	dec  *json.Decoder
	enc  *json.Encoder
	Pid  int // the daemon's
}

// DaemonSocketPath is where the daemon of stateRoot listens.
func DaemonSocketPath(stateRoot string) string { return filepath.Join(stateRoot, DaemonSocket) }

// DialDaemon connects to the daemon of stateRoot (ErrNoDaemon when none
// answers).
func DialDaemon(stateRoot string) (*Daemon, error) {
	p, done, err := sockPath(stateRoot, DaemonSocket)
	if err != nil {
		return nil, fmt.Errorf("%w on %s: %v", ErrNoDaemon, DaemonSocketPath(stateRoot), err)
	}
	defer done()
	conn, err := net.DialTimeout("unix", p, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%w on %s: %v", ErrNoDaemon, DaemonSocketPath(stateRoot), err)
	}
	d := &Daemon{conn: conn, dec: json.NewDecoder(conn), enc: json.NewEncoder(conn)}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := d.call(daemonRequest{Op: "ping"})
	_ = conn.SetDeadline(time.Time{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w on %s: %v", ErrNoDaemon, DaemonSocketPath(stateRoot), err)
	}
	d.Pid = resp.Pid
	return d, nil
}

// KnownSandbox reports whether stateRoot has a sandbox called id (its
// directory with a record), without asking the daemon.
func KnownSandbox(stateRoot, id string) bool {
	if !validID(id) {
		return false
	}
	_, err := os.Stat(filepath.Join(stateRoot, "sandboxes", id, recordName))
	return err == nil
}

// WorkDir is the work directory of the managed sandbox id of stateRoot
// (its layers.Config: layers.ReadMeta).
func WorkDir(stateRoot, id string) string {
	return filepath.Join(stateRoot, "sandboxes", id, "work")
}

// SandboxAtMountpoint returns the id of the sandbox of stateRoot whose
// recorded mountpoint is mnt (clean, absolute, symlinks resolved), read
// from the records on disk without asking the daemon: the active one
// (there is at most one), else the one created last (whose state then
// says why it cannot be used). ok is false when none has it.
func SandboxAtMountpoint(stateRoot, mnt string) (id string, ok bool) {
	s, err := scanSandboxes(filepath.Join(stateRoot, "sandboxes"))
	if err != nil {
		return "", false
	}
	var best *record
	for _, r := range sortRecords(s.records) {
		if r.Mountpoint != mnt {
			continue
		}
		if best == nil || best.State != Active {
			best = r // List order: a later one replaces an earlier one, unless that is active
		}
	}
	if best == nil {
		return "", false
	}
	return best.ID, true
}

// RecordedMountpoint returns the mountpoint recorded for the sandbox id
// of stateRoot, read from its record on disk without asking the daemon.
func RecordedMountpoint(stateRoot, id string) (string, bool) {
	if !validID(id) {
		return "", false
	}
	r, err := readRecord(filepath.Join(stateRoot, "sandboxes", id))
	if err != nil {
		return "", false
	}
	return r.Mountpoint, true
}

// ValidID reports whether s has the form of a sandbox id (16 lowercase
// hex digits).
func ValidID(s string) bool { return validID(s) }

// Close ends the connection.
func (d *Daemon) Close() error { return d.conn.Close() }

// call sends req and reads its response; a failure the daemon reported is
// a *DaemonError, returned with the response (which holds what was done).
func (d *Daemon) call(req daemonRequest) (daemonResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var resp daemonResponse
	if err := d.enc.Encode(req); err != nil {
		return resp, fmt.Errorf("daemon %s: %w: %v", req.Op, ErrDaemonGone, err)
	}
	if err := d.dec.Decode(&resp); err != nil {
		return resp, fmt.Errorf("daemon %s: %w: %v", req.Op, ErrDaemonGone, err)
	}
	if !resp.OK {
		code := resp.Code
		if code == "" {
			code = CodeFailed
		}
		return resp, &DaemonError{Code: code, Msg: resp.Error, Errno: resp.Errno}
	}
	return resp, nil
}

// Ping returns the daemon's pid.
func (d *Daemon) Ping() (int, error) {
	resp, err := d.call(daemonRequest{Op: "ping"})
	return resp.Pid, err
}

// Unmount takes sandbox id's mount down; it stays active and the next
// daemon mounts it again (see Manager.Unmount).
func (d *Daemon) Unmount(id string, lazy bool) error {
	_, err := d.call(daemonRequest{Op: "unmount", ID: id, Lazy: lazy})
	return err
}

// Mount mounts sandbox id again at its recorded mountpoint and returns
// it (see Manager.Mount).
func (d *Daemon) Mount(id string) (Sandbox, error) {
	resp, err := d.call(daemonRequest{Op: "mount", ID: id})
	return resp.sandbox(err)
}

// Moved records original (absolute) as the new place of the moved
// original of sandbox id and mounts the sandbox there (see
// Manager.Moved).
func (d *Daemon) Moved(id, original string) (Sandbox, error) {
	resp, err := d.call(daemonRequest{Op: "moved", ID: id, Original: original})
	return resp.sandbox(err)
}

// Stop asks the daemon to stop as on SIGTERM: it answers, then unmounts
// every sandbox (they stay active) and exits. Stop returns once it has
// answered, not once it has exited: wait for the process (d.Pid).
func (d *Daemon) Stop() error {
	_, err := d.call(daemonRequest{Op: "stop"})
	return err
}

// Create makes a sandbox (see Manager.Create).
func (d *Daemon) Create(o CreateOptions) (Sandbox, error) {
	resp, err := d.call(daemonRequest{Op: "create", Plan: o.Plan, Name: o.Name, Original: o.Original, Mountpoint: o.Mountpoint})
	return resp.sandbox(err)
}

// Get returns the sandbox id.
func (d *Daemon) Get(id string) (Sandbox, error) {
	resp, err := d.call(daemonRequest{Op: "get", ID: id})
	return resp.sandbox(err)
}

func (r daemonResponse) sandbox(err error) (Sandbox, error) {
	if err != nil {
		return Sandbox{}, err
	}
	if r.Sandbox == nil {
		return Sandbox{}, fmt.Errorf("%w: the daemon sent no sandbox", ErrDaemonGone)
	}
	return r.Sandbox.Sandbox(), nil
}

// List returns the sandboxes of plan ("" for all), every state included.
func (d *Daemon) List(plan string) ([]Sandbox, error) {
	resp, err := d.call(daemonRequest{Op: "list", Plan: plan})
	if err != nil {
		return nil, err
	}
	out := make([]Sandbox, 0, len(resp.Sandboxes))
	for _, i := range resp.Sandboxes {
		out = append(out, i.Sandbox())
	}
	return out, nil
}

// Commit commits t (Manager.Commit or Manager.CommitPlan). As there, the
// result always comes, and on failure the error is the same value as a
// *PlanError whose Err is the daemon's *DaemonError (or ErrDaemonGone).
func (d *Daemon) Commit(t Target, o CommitOptions) (*PlanResult, error) {
	resp, err := d.call(daemonRequest{Op: "commit", ID: t.ID, Plan: t.Plan, Message: o.Message,
		Force: o.Force, Keep: o.Keep, WaitMs: o.Wait.Milliseconds()})
	res := &PlanResult{Plan: resp.Plan, Committed: resp.Committed, RolledBack: resp.RolledBack, StillMounted: resp.StillMounted,
		Applied: resp.Applied, Err: err}
	for _, f := range resp.RollbackFailed {
		res.RollbackFailed = append(res.RollbackFailed, f.failure())
	}
	if res.Plan == "" {
		res.Plan = t.Plan
	}
	return res.finish()
}

// Rollback rolls back t (Manager.Rollback or Manager.RollbackPlan).
func (d *Daemon) Rollback(t Target, keep bool) (*BatchResult, error) {
	return d.batch(daemonRequest{Op: "rollback", ID: t.ID, Plan: t.Plan, Keep: keep})
}

// Destroy destroys t (Manager.Destroy or Manager.DestroyPlan).
func (d *Daemon) Destroy(t Target) (*BatchResult, error) {
	return d.batch(daemonRequest{Op: "destroy", ID: t.ID, Plan: t.Plan})
}

// GC purges what was abandoned (Manager.GC).
func (d *Daemon) GC() (*BatchResult, error) {
	return d.batch(daemonRequest{Op: "gc"})
}

// batch runs a batch request: the result always comes; on failure the
// error is the same value as a *BatchError whose Err is the daemon's.
func (d *Daemon) batch(req daemonRequest) (*BatchResult, error) {
	resp, err := d.call(req)
	res := &BatchResult{Op: resp.Op, Done: resp.Done, Err: err}
	if res.Op == "" {
		res.Op = req.Op
	}
	for _, f := range resp.Failed {
		res.Failed = append(res.Failed, f.failure())
	}
	if err == nil {
		return res, nil
	}
	return res, (*BatchError)(res)
}

func (f FailureInfo) failure() Failure {
	code := f.Code
	if code == "" {
		code = CodeFailed
	}
	return Failure{ID: f.ID, Err: &DaemonError{Code: code, Msg: f.Error, Errno: f.Errno}}
}
