package manager

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/fuse"
)

// The daemon socket: the manager of a state root answers other processes
// (the CLI's managed commands) on StateRoot/daemon.sock (mode 0600), one
// JSON request per line, one JSON response per line:
//
//	{"op":"create","plan":P,"name":N,"original":O,"mountpoint":M} -> sandbox
//	{"op":"list","plan":P}                                          -> sandboxes
//	{"op":"get","id":ID}                                            -> sandbox
//	{"op":"commit","id":ID|"plan":P,"message":M,"force":F,"keep":K,"wait_ms":W}
//	                                  -> plan, committed, rolled_back, rollback_failed
//	{"op":"rollback","id":ID|"plan":P,"keep":K}                     -> done, failed
//	{"op":"destroy","id":ID|"plan":P}                               -> done, failed
//	{"op":"gc"}                                                     -> done, failed
//	{"op":"unmount","id":ID,"lazy":L}                               -> (the sandbox stays active)
//	{"op":"mount","id":ID}                                          -> sandbox (mounted again)
//	{"op":"ping"}                                                   -> pid
//	{"op":"stop"}                                                   -> pid; then the daemon stops
//
// Every response has ok and pid (the daemon's); a failure has error (the
// message), code (what kind: see the Code constants) and errno (the
// system error beneath it, as "EROFS", when there is one), and keeps the
// partial result of the operation (which sandboxes were committed, which
// are unchanged, which undo failed).

// DaemonSocket is the daemon socket's name in the state root.
const DaemonSocket = "daemon.sock"

// Error codes on the daemon socket.
const (
	CodeNotFound = "not_found" // no such sandbox (ErrNotFound)
	CodeBusy     = "busy"      // files open, a mount busy, the state root locked
	CodeConflict = "conflict"  // the original changed underneath, or sandboxes overlap
	// CodeChangedWhileRead: a conflict where every look of the commit
	// that failed met the original changing (commit.Error.WhileRead):
	// nothing is lost, and a commit once the original is still may pass.
	CodeChangedWhileRead = "changed_while_read"
	CodeIllegalMove      = "illegal_move"     // the sandbox's state forbids it (ErrIllegalMove, ErrNotActive)
	CodeInvalid          = "invalid"          // a bad request or argument (ErrInvalid)
	CodeOriginalMissing  = "original_missing" // a sandbox's original was moved or removed (ErrOriginalMissing)
	CodeOtherMount       = "other_mount"      // a change lies on a filesystem mounted inside the original (commit.ErrOtherMount)
	CodeFailed           = "failed"           // anything else
)

type daemonRequest struct {
	Op         string `json:"op"`
	ID         string `json:"id,omitempty"`
	Plan       string `json:"plan,omitempty"`
	Name       string `json:"name,omitempty"`
	Original   string `json:"original,omitempty"`
	Mountpoint string `json:"mountpoint,omitempty"`
	Message    string `json:"message,omitempty"`
	Force      bool   `json:"force,omitempty"`
	Keep       bool   `json:"keep,omitempty"`
	WaitMs     int64  `json:"wait_ms,omitempty"`
	Lazy       bool   `json:"lazy,omitempty"`
}

// MarshalJSON sends the request's paths byte for byte (fsutil.EncodeRaw).
func (r daemonRequest) MarshalJSON() ([]byte, error) {
	type plain daemonRequest
	p := plain(r)
	fsutil.EncodeRawFields(&p.Original, &p.Mountpoint)
	return json.Marshal(p)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *daemonRequest) UnmarshalJSON(b []byte) error {
	type plain daemonRequest
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	return fsutil.DecodeRawFields(&r.Original, &r.Mountpoint)
}

type daemonResponse struct {
	OK             bool          `json:"ok"`
	Pid            int           `json:"pid"`
	Error          string        `json:"error,omitempty"`
	Code           string        `json:"code,omitempty"`
	Errno          string        `json:"errno,omitempty"`
	Sandbox        *SandboxInfo  `json:"sandbox,omitempty"`
	Sandboxes      []SandboxInfo `json:"sandboxes,omitempty"`
	Plan           string        `json:"plan,omitempty"`
	Committed      []string      `json:"committed,omitempty"`
	RolledBack     []string      `json:"rolled_back,omitempty"`
	RollbackFailed []FailureInfo `json:"rollback_failed,omitempty"`
	StillMounted   []string      `json:"still_mounted,omitempty"`
	Applied        []Applied     `json:"applied,omitempty"`
	Op             string        `json:"batch_op,omitempty"`
	Done           []string      `json:"done,omitempty"`
	Failed         []FailureInfo `json:"failed,omitempty"`
}

// SandboxInfo is a Sandbox as JSON (on the daemon socket and in the CLI's
// --json output).
type SandboxInfo struct {
	ID         string    `json:"id"`
	Plan       string    `json:"plan"`
	Name       string    `json:"name,omitempty"`
	Original   string    `json:"original"`
	Mountpoint string    `json:"mountpoint"`
	State      State     `json:"state"`
	Mounted    bool      `json:"mounted"`
	Created    time.Time `json:"created"`
	Dir        string    `json:"dir"`
	Upper      string    `json:"upper"`
	Work       string    `json:"work"`
	Error      string    `json:"error,omitempty"`
}

// sandboxInfoB64 holds the exact bytes of SandboxInfo's paths that are
// not valid UTF-8 (fsutil.B64IfInvalid), as every JSON sbxfs prints has.
type sandboxInfoB64 struct {
	OriginalB64   string `json:"original_b64,omitempty"`
	MountpointB64 string `json:"mountpoint_b64,omitempty"`
	DirB64        string `json:"dir_b64,omitempty"`
	UpperB64      string `json:"upper_b64,omitempty"`
	WorkB64       string `json:"work_b64,omitempty"`
}

// MarshalJSON writes i with original_b64 (mountpoint_b64, dir_b64,
// upper_b64, work_b64) beside a path that is not valid UTF-8.
func (i SandboxInfo) MarshalJSON() ([]byte, error) {
	type plain SandboxInfo
	return json.Marshal(struct {
		plain
		sandboxInfoB64
	}{plain(i), sandboxInfoB64{
		OriginalB64: fsutil.B64IfInvalid(i.Original), MountpointB64: fsutil.B64IfInvalid(i.Mountpoint),
		DirB64: fsutil.B64IfInvalid(i.Dir), UpperB64: fsutil.B64IfInvalid(i.Upper), WorkB64: fsutil.B64IfInvalid(i.Work),
	}})
}

// UnmarshalJSON reads what MarshalJSON writes, the exact paths included.
func (i *SandboxInfo) UnmarshalJSON(b []byte) error {
	type plain SandboxInfo
	v := struct {
		*plain
		sandboxInfoB64
	}{plain: (*plain)(i)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return fsutil.DecodeB64Fields([]*string{&i.Original, &i.Mountpoint, &i.Dir, &i.Upper, &i.Work},
		[]string{v.OriginalB64, v.MountpointB64, v.DirB64, v.UpperB64, v.WorkB64})
}

// FailureInfo is a Failure as JSON.
type FailureInfo struct {
	ID    string `json:"id"`
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
	Errno string `json:"errno,omitempty"`
}

// Info is sb as JSON.
func Info(sb Sandbox) SandboxInfo {
	return SandboxInfo{ID: sb.ID, Plan: sb.Plan, Name: sb.Name, Original: sb.Original, Mountpoint: sb.Mountpoint,
		State: sb.State, Mounted: sb.Mounted, Created: sb.Created, Dir: sb.Dir, Upper: sb.Upper, Work: sb.Work, Error: sb.Error}
}

// Sandbox is the Sandbox i describes.
func (i SandboxInfo) Sandbox() Sandbox {
	return Sandbox{ID: i.ID, Plan: i.Plan, Name: i.Name, Original: i.Original, Mountpoint: i.Mountpoint,
		State: i.State, Mounted: i.Mounted, Created: i.Created, Dir: i.Dir, Upper: i.Upper, Work: i.Work, Error: i.Error}
}

// FailureInfos is fs as JSON (never nil).
func FailureInfos(fs []Failure) []FailureInfo {
	out := make([]FailureInfo, 0, len(fs))
	for _, f := range fs {
		out = append(out, FailureInfo{ID: f.ID, Error: fmt.Sprint(f.Err), Code: ErrorCode(f.Err), Errno: ErrnoName(f.Err)})
	}
	return out
}

// ErrorCode says what kind of failure err is (one of the Code constants).
func ErrorCode(err error) string {
	var be *fuse.BusyError
	var de *DaemonError
	var ce *commit.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &de):
		return de.Code
	case errors.Is(err, ErrNotFound):
		return CodeNotFound
	case errors.Is(err, commit.ErrConflict) && errors.As(err, &ce) && ce.WhileRead():
		return CodeChangedWhileRead
	case errors.Is(err, commit.ErrConflict), errors.Is(err, ErrOverlap):
		return CodeConflict
	case errors.Is(err, commit.ErrBusy), errors.As(err, &be), errors.Is(err, ErrLocked), errors.Is(err, unix.EBUSY),
		errors.Is(err, ErrNested), errors.Is(err, ErrMounted), errors.Is(err, ErrParentUnmounted):
		return CodeBusy
	case errors.Is(err, ErrIllegalMove), errors.Is(err, ErrNotActive):
		return CodeIllegalMove
	case errors.Is(err, ErrInvalid):
		return CodeInvalid
	case errors.Is(err, ErrOriginalMissing):
		return CodeOriginalMissing
	case errors.Is(err, commit.ErrOtherMount):
		return CodeOtherMount
	}
	return CodeFailed
}

// ErrnoName names the system error beneath err ("EROFS"), "" when there
// is none. The daemon sends it with a failure, so that a client matches
// the failure with errors.Is(err, unix.EROFS) as it would its own.
func ErrnoName(err error) string {
	var en unix.Errno
	var de *DaemonError
	switch {
	case errors.As(err, &de):
		return de.Errno
	case errors.As(err, &en):
		return unix.ErrnoName(en)
	}
	return ""
}

// DaemonServer answers the daemon socket of one manager.
type DaemonServer struct {
	m      *Manager
	ln     net.Listener
	path   string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool

	stopOnce sync.Once
	stop     chan struct{} // closed once a client asked the daemon to stop
}

// ServeDaemon listens on stateRoot/daemon.sock (mode 0600; stateRoot ""
// is m's) and answers requests with m until Close. The caller holds the
// state root (m), so a socket left by a dead daemon is replaced.
func ServeDaemon(m *Manager, stateRoot string) (*DaemonServer, error) {
	if stateRoot == "" {
		stateRoot = m.StateRoot()
	}
	path := filepath.Join(stateRoot, DaemonSocket)
	_ = os.Remove(path)
	p, done, err := sockPath(stateRoot, DaemonSocket)
	if err != nil {
		return nil, fmt.Errorf("daemon socket: %w", err)
	}
	defer done()
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", p)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("daemon socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // the name is a /proc path; Close removes path
	ctx, cancel := context.WithCancel(context.Background())
	s := &DaemonServer{m: m, ln: ln, path: path, ctx: ctx, cancel: cancel, conns: map[net.Conn]bool{}, stop: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Path is the socket's path.
func (s *DaemonServer) Path() string { return s.path }

// StopRequested is closed once a client asked the daemon to stop (the
// "stop" request, answered first): the daemon's owner then stops as on
// SIGTERM (Close, then Manager.Close).
func (s *DaemonServer) StopRequested() <-chan struct{} { return s.stop }

// Close stops answering: it removes the socket, cancels the operations
// in flight (a commit not past its commit point is undone), ends every
// connection and waits for their handlers.
func (s *DaemonServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	_ = os.Remove(s.path)
	s.cancel()
	s.wg.Wait()
	return err
}

func (s *DaemonServer) accept() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.conns[conn] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(conn)
	}
}

func (s *DaemonServer) serve(conn net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		conn.Close()
	}()
	dec := json.NewDecoder(bufio.NewReader(conn))
	enc := json.NewEncoder(conn)
	for {
		var req daemonRequest
		if err := dec.Decode(&req); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_ = enc.Encode(daemonResponse{Pid: os.Getpid(), Error: "bad request: " + err.Error(), Code: CodeInvalid})
			}
			return
		}
		resp := s.handle(req)
		resp.Pid = os.Getpid()
		err := enc.Encode(resp)
		if req.Op == "stop" {
			s.m.log.Info("daemon stop requested")
			s.stopOnce.Do(func() { close(s.stop) })
		}
		if err != nil {
			return
		}
	}
}

// handle runs one request. A panic fails the request, not the daemon
// (which serves every mount).
func (s *DaemonServer) handle(req daemonRequest) (resp daemonResponse) {
	var err error
	defer func() {
		if p := recover(); p != nil {
			s.m.log.Error("daemon request panicked", "op", req.Op, "panic", p)
			resp = daemonResponse{Error: fmt.Sprintf("%s: internal error: %v", req.Op, p), Code: CodeFailed}
		}
	}()
	switch req.Op {
	case "ping", "stop":
	case "unmount":
		if req.ID == "" {
			err = fmt.Errorf("%w: unmount needs a sandbox id", ErrInvalid)
		} else {
			err = s.m.Unmount(s.ctx, req.ID, req.Lazy)
		}
	case "mount":
		var sb Sandbox
		if req.ID == "" {
			err = fmt.Errorf("%w: mount needs a sandbox id", ErrInvalid)
		} else if sb, err = s.m.Mount(s.ctx, req.ID); err == nil {
			info := Info(sb)
			resp.Sandbox = &info
		}
	case "moved":
		var sb Sandbox
		if req.ID == "" || req.Original == "" {
			err = fmt.Errorf("%w: moved needs a sandbox id and the new place of its original", ErrInvalid)
		} else if sb, err = s.m.Moved(s.ctx, req.ID, req.Original); err == nil {
			info := Info(sb)
			resp.Sandbox = &info
		}
	case "create":
		var sb Sandbox
		sb, err = s.m.Create(s.ctx, CreateOptions{Plan: req.Plan, Name: req.Name, Original: req.Original, Mountpoint: req.Mountpoint})
		if err == nil {
			info := Info(sb)
			resp.Sandbox = &info
		}
	case "get":
		var sb Sandbox
		if sb, err = s.m.Get(req.ID); err == nil {
			info := Info(sb)
			resp.Sandbox = &info
		}
	case "list":
		resp.Sandboxes = []SandboxInfo{}
		for _, sb := range s.m.List(req.Plan) {
			resp.Sandboxes = append(resp.Sandboxes, Info(sb))
		}
	case "commit":
		err = s.commit(req, &resp)
	case "rollback", "destroy", "gc":
		err = s.batch(req, &resp)
	default:
		err = fmt.Errorf("%w: unknown request %q", ErrInvalid, req.Op)
	}
	resp.OK = err == nil
	if err != nil {
		resp.Error, resp.Code, resp.Errno = cause(err).Error(), ErrorCode(err), ErrnoName(err)
	}
	return resp
}

// cause is err without the result around it: the client rebuilds the
// *PlanError or *BatchError from the response's fields.
func cause(err error) error {
	var pe *PlanError
	var be *BatchError
	switch {
	case errors.As(err, &pe) && pe.Err != nil:
		return pe.Err
	case errors.As(err, &be) && be.Err != nil:
		return be.Err
	}
	return err
}

// target checks that a request names exactly one of a sandbox or a plan.
func target(req daemonRequest) error {
	if (req.ID == "") == (req.Plan == "") {
		return fmt.Errorf("%w: %s needs a sandbox id or a plan (one of them)", ErrInvalid, req.Op)
	}
	return nil
}

func (s *DaemonServer) commit(req daemonRequest, resp *daemonResponse) error {
	if err := target(req); err != nil {
		return err
	}
	o := CommitOptions{Message: req.Message, Force: req.Force, Keep: req.Keep, Wait: time.Duration(req.WaitMs) * time.Millisecond}
	var res *PlanResult
	var err error
	if req.ID != "" {
		res, err = s.m.Commit(s.ctx, req.ID, o)
	} else {
		res, err = s.m.CommitPlan(s.ctx, req.Plan, o)
	}
	if res != nil {
		resp.Plan, resp.Committed, resp.RolledBack, resp.StillMounted = res.Plan, res.Committed, res.RolledBack, res.StillMounted
		resp.RollbackFailed = FailureInfos(res.RollbackFailed)
		resp.Applied = res.Applied
	}
	return err
}

func (s *DaemonServer) batch(req daemonRequest, resp *daemonResponse) error {
	var res *BatchResult
	var err error
	switch {
	case req.Op == "gc":
		res, err = s.m.GC(s.ctx)
	case target(req) != nil:
		return target(req)
	case req.Op == "rollback" && req.ID != "":
		res, err = s.m.Rollback(s.ctx, req.ID, req.Keep)
	case req.Op == "rollback":
		res, err = s.m.RollbackPlan(s.ctx, req.Plan, req.Keep)
	case req.ID != "":
		res = &BatchResult{Op: "destroy " + req.ID}
		if err = s.m.Destroy(s.ctx, req.ID); err == nil {
			res.Done = []string{req.ID}
		} else {
			res.fail(req.ID, err)
		}
	default:
		res, err = s.m.DestroyPlan(s.ctx, req.Plan)
	}
	if res != nil {
		resp.Op, resp.Done, resp.Failed = res.Op, res.Done, FailureInfos(res.Failed)
	}
	return err
}
