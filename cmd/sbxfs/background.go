package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A backgrounded mount is served by a child process: the parent re-executes
// itself in the foreground form and waits until the child reports on the
// ready pipe, so it exits 0 only once the mount is live. The child reads
// the pipe's descriptor number from readyEnv and writes one line:
//
//	ok
//	error <exit code> <message>
//
// EOF without a line means the child died; its log tells why.
const readyEnv = "SBXFS_READY_FD"

// readyTimeout bounds the wait for the child's report.
const readyTimeout = 60 * time.Second

// readyPipe is the child's end of the ready pipe; nil when the process was
// not started by a backgrounding parent.
type readyPipe struct {
	f *os.File
}

// ready is this process's ready pipe, taken from the environment by main.
var ready *readyPipe

// takeReadyPipe takes the ready pipe from the environment, removing the
// variable so that no process this one starts sees it.
func takeReadyPipe() *readyPipe {
	v, ok := os.LookupEnv(readyEnv)
	if !ok {
		return nil
	}
	os.Unsetenv(readyEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	unix.CloseOnExec(fd)
	return &readyPipe{f: os.NewFile(uintptr(fd), "ready")}
}

// ok tells the parent the mount is live.
func (r *readyPipe) ok() { r.send("ok\n") }

// fail tells the parent why the mount failed.
func (r *readyPipe) fail(code int, msg string) {
	msg = strings.Join(strings.Fields(msg), " ") // one line
	r.send(fmt.Sprintf("error %d %s\n", code, msg))
}

func (r *readyPipe) send(line string) {
	if r == nil || r.f == nil {
		return
	}
	_, _ = io.WriteString(r.f, line)
	_ = r.f.Close()
	r.f = nil
}

// logLimit is the size past which a log is set aside (as LOG.1, replacing
// the one before) when a server starts: a daemon's log would otherwise
// grow with every sandbox it ever served.
const logLimit = 16 << 20

// rotateLog sets the log at logPath aside when it has grown past logLimit.
func rotateLog(logPath string) {
	if st, err := os.Lstat(logPath); err == nil && st.Mode().IsRegular() && st.Size() > logLimit {
		_ = os.Rename(logPath, logPath+".1")
	}
}

// startBackground starts args (argv of the foreground form) as a detached
// child serving the mount, with its output appended to logPath, and waits
// until the mount is live or has failed.
func startBackground(args []string, logPath string) error {
	rd, wr, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("ready pipe: %w", err)
	}
	defer rd.Close()
	rotateLog(logPath)
	// Never through a symlink (planted, it would have the server append
	// to some other file), never blocking on a FIFO.
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	if err == nil {
		if st, serr := logf.Stat(); serr == nil && !st.Mode().IsRegular() {
			logf.Close()
			err = fmt.Errorf("not a regular file (%v)", st.Mode().Type())
		}
	}
	if err != nil {
		wr.Close()
		return failf(exitBadPath, "server log %s: %v; it must be a regular file: remove it", logPath, err)
	}
	var logStart int64 // where this server's output begins
	if st, err := logf.Stat(); err == nil {
		logStart = st.Size()
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		wr.Close()
		logf.Close()
		return err
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = args
	cmd.Env = append(os.Environ(), readyEnv+"=3")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.ExtraFiles = []*os.File{wr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	wr.Close()
	logf.Close()
	devnull.Close()
	if err != nil {
		return fmt.Errorf("start server: %w", err)
	}
	return awaitReady(cmd, rd, serverOutput{logPath, logStart})
}

// serverOutput is the part of a server log one server wrote.
type serverOutput struct {
	path  string
	start int64
}

// awaitReady reads the child's report and turns it into this command's
// result.
func awaitReady(cmd *exec.Cmd, rd io.Reader, log serverOutput) error {
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(rd).ReadString('\n')
		lines <- line
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(readyTimeout):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return failf(exitMountFailed, "the server did not report within %s and was killed; see %s", readyTimeout, log.path)
	}
	line = strings.TrimSuffix(line, "\n")
	if line == "ok" {
		return cmd.Process.Release()
	}
	waitErr := cmd.Wait() // the child exits right after reporting
	if rest, found := strings.CutPrefix(line, "error "); found {
		codeStr, msg, _ := strings.Cut(rest, " ")
		code, err := strconv.Atoi(codeStr)
		if err != nil || code == exitOK {
			code = exitInternal
		}
		if detail := log.tail(10, "sbxfs: "); code == exitMountFailed && detail != "" {
			msg += "\nserver output:\n" + detail
		}
		return &exitError{code: code, err: errors.New(msg)}
	}
	return failf(exitMountFailed, "the server exited before the mount was live (%v); see its log %s, which ends with:\n%s",
		waitErr, log.path, log.tail(10, ""))
}

// tail returns the last n lines this server wrote to its log, indented,
// leaving out lines that start with skip (when not empty).
func (o serverOutput) tail(n int, skip string) string {
	f, err := os.Open(o.path)
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	defer f.Close()
	const window = 8 << 10
	st, err := f.Stat()
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	off := max(o.start, st.Size()-window)
	b := make([]byte, max(0, st.Size()-off))
	nr, _ := f.ReadAt(b, off)
	var ls []string
	for _, l := range strings.Split(string(bytes.TrimRight(b[:nr], "\n")), "\n") {
		if l != "" && (skip == "" || !strings.HasPrefix(l, skip)) {
			ls = append(ls, "  "+l)
		}
	}
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
}

// serverLog is where a backgrounded server writes its output.
func serverLog(work string) string { return filepath.Join(work, "server.log") }

// closeStrayFds closes every descriptor above stderr that this process
// inherited without close-on-exec (Go opens all of its own with it), but
// the ready pipe. A serving process must not hold files of other
// FUSE mounts: exiting, it would flush them and wait on their servers, and
// two servers holding each other's files never finish exiting.
func closeStrayFds() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	keep, _ := strconv.Atoi(os.Getenv(readyEnv))
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 || fd == keep {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}
