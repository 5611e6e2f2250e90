// Package manager holds sandboxes and plans, and the control interface of
// a serving process: whoever serves a mount answers for it (freeze, thaw,
// reset, unmount) over a private unix socket in the sandbox's work
// directory, so a commit works the same on a standalone mount and on a
// managed one.
package manager

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/fuse"
)

// ControlSocket is the control socket's name in the work directory.
const ControlSocket = "control.sock"

// Controlled is what a serving process offers its controllers.
type Controlled interface {
	Freeze(wait time.Duration) error
	Thaw()
	Reset() error
	Unmount() error
	Sync() error // the upper and the journal made durable (fuse.Server.Sync)
}

type request struct {
	Op     string `json:"op"` // freeze, thaw, reset, unmount, sync, ping
	WaitMs int64  `json:"wait_ms,omitempty"`
}

type response struct {
	OK        bool     `json:"ok"`
	Error     string   `json:"error,omitempty"`
	Busy      []string `json:"busy,omitempty"`       // files open for writing (freeze)
	MountBusy bool     `json:"mount_busy,omitempty"` // the mount is in use (unmount)
	Pid       int      `json:"pid,omitempty"`
}

// MarshalJSON sends the busy files' paths byte for byte (fsutil.EncodeRaw).
func (r response) MarshalJSON() ([]byte, error) {
	type plain response
	p := plain(r)
	p.Busy = fsutil.EncodeRawSlice(r.Busy)
	return json.Marshal(p)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *response) UnmarshalJSON(b []byte) error {
	type plain response
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	return fsutil.DecodeRawSlice(r.Busy)
}

// ControlServer answers control requests for one mount.
type ControlServer struct {
	ln       net.Listener
	path     string
	c        Controlled
	wg       sync.WaitGroup
	answerMu sync.RWMutex // held (read) while a request is answered; Close takes it
}

// sockPath reaches name in dir through a descriptor, so the socket path
// stays short whatever the length of dir (sun_path holds 108 bytes).
func sockPath(dir, name string) (string, func(), error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, name), func() { unix.Close(fd) }, nil
}

// ServeControl listens on work/control.sock (mode 0600) and answers
// requests for c until Close. A client that freezes the mount and goes
// away (it crashed) thaws it.
func ServeControl(work string, c Controlled) (*ControlServer, error) {
	_ = os.Remove(filepath.Join(work, ControlSocket))
	p, done, err := sockPath(work, ControlSocket)
	if err != nil {
		return nil, err
	}
	defer done()
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", p)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// Close would unlink by the /proc/self/fd path, whose descriptor is
	// closed (and maybe reused) by then: remove by the real path instead.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	s := &ControlServer{ln: ln, c: c, path: filepath.Join(work, ControlSocket)}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *ControlServer) accept() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.serve(conn)
	}
}

func (s *ControlServer) serve(conn net.Conn) {
	defer s.wg.Done()
	defer conn.Close()
	frozen := false
	defer func() {
		if frozen {
			s.c.Thaw()
		}
	}()
	dec := json.NewDecoder(bufio.NewReader(conn))
	enc := json.NewEncoder(conn)
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			return
		}
		s.answerMu.RLock()
		resp := response{OK: true, Pid: os.Getpid()}
		var err error
		switch req.Op {
		case "ping":
		case "freeze":
			if err = s.c.Freeze(time.Duration(req.WaitMs) * time.Millisecond); err == nil {
				frozen = true
			}
		case "thaw":
			s.c.Thaw()
			frozen = false
		case "reset":
			err = s.c.Reset()
		case "sync":
			err = s.c.Sync()
		case "unmount":
			// A busy mount stays frozen (fuse.Server.Unmount): the
			// caller resets it next.
			if err = s.c.Unmount(); err == nil {
				frozen = false
			}
		default:
			err = fmt.Errorf("unknown request %q", req.Op)
		}
		if err != nil {
			resp.OK, resp.Error = false, err.Error()
			var be *fuse.BusyError
			if errors.As(err, &be) {
				resp.Busy = be.Paths
			}
			resp.MountBusy = errors.Is(err, unix.EBUSY)
		}
		err = enc.Encode(resp)
		s.answerMu.RUnlock()
		if err != nil {
			return
		}
	}
}

// Close stops answering (open connections end with their clients). It
// waits for the answers being given: the serving process exits after it,
// and an unmount ends the mount before its answer is sent.
func (s *ControlServer) Close() error {
	err := s.ln.Close()
	s.answerMu.Lock()
	defer s.answerMu.Unlock()
	if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
		err = rerr
	}
	return err
}

// Control is a connection to a serving process.
type Control struct {
	conn net.Conn
	dec  *json.Decoder
	enc  *json.Encoder
	Pid  int
}

// ErrNoServer says no process serves the sandbox.
var ErrNoServer = errors.New("no process serves this sandbox")

// DialControl connects to the process serving the sandbox whose work
// directory is work.
func DialControl(work string) (*Control, error) {
	p, done, err := sockPath(work, ControlSocket)
	if err != nil {
		return nil, err
	}
	defer done()
	conn, err := net.DialTimeout("unix", p, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoServer, err)
	}
	c := &Control{conn: conn, dec: json.NewDecoder(conn), enc: json.NewEncoder(conn)}
	resp, err := c.call(request{Op: "ping"})
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.Pid = resp.Pid
	return c, nil
}

func (c *Control) call(req request) (response, error) {
	var resp response
	if err := c.enc.Encode(req); err != nil {
		return resp, fmt.Errorf("control %s: %w", req.Op, err)
	}
	if err := c.dec.Decode(&resp); err != nil {
		return resp, fmt.Errorf("control %s: %w", req.Op, err)
	}
	if !resp.OK {
		if len(resp.Busy) > 0 {
			return resp, &fuse.BusyError{Paths: resp.Busy}
		}
		if resp.MountBusy {
			return resp, mountBusyError(resp.Error)
		}
		return resp, errors.New(resp.Error)
	}
	return resp, nil
}

// mountBusyError is a serving process's answer that its mount is in use:
// it is unix.EBUSY.
type mountBusyError string

func (e mountBusyError) Error() string        { return string(e) }
func (e mountBusyError) Is(target error) bool { return target == unix.EBUSY }

// Freeze stops changes to the mount (see fuse.Server.Freeze); the mount
// thaws when this connection closes.
func (c *Control) Freeze(wait time.Duration) error {
	_, err := c.call(request{Op: "freeze", WaitMs: wait.Milliseconds()})
	return err
}

// Thaw lets changes through again.
func (c *Control) Thaw() error { _, err := c.call(request{Op: "thaw"}); return err }

// Reset empties the sandbox while it stays mounted (it must be frozen).
func (c *Control) Reset() error { _, err := c.call(request{Op: "reset"}); return err }

// Sync has the server make its upper and journal durable.
func (c *Control) Sync() error { _, err := c.call(request{Op: "sync"}); return err }

// Unmount asks the server to unmount; it exits afterwards.
func (c *Control) Unmount() error { _, err := c.call(request{Op: "unmount"}); return err }

// Close ends the connection (and thaws a mount it froze).
func (c *Control) Close() error { return c.conn.Close() }
