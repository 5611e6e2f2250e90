// Package shellwriter runs, for tests, a shell working in a directory
// (which keeps a mount there busy) that creates files n1, n2, ... in it,
// each holding its number, until stopped: a user's process that goes on
// changing a sandbox while a commit takes it.
package shellwriter

import (
	"bytes"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Writer is a running shell.
type Writer struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	out bytes.Buffer
}

// Start starts a shell in dir.
func Start(dir string) (*Writer, error) {
	w := &Writer{cmd: exec.Command("sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > n$i || exit 1; echo $i; sleep 0.01; done`)}
	w.cmd.Dir, w.cmd.Stdout = dir, (*output)(w)
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	return w, nil
}

// Run starts a shell in dir for the test t, stops it when t ends (call
// Run after what cleans up dir, such as its mount, so that it runs first)
// and waits until it has made a file.
func Run(t testing.TB, dir string) *Writer {
	t.Helper()
	w, err := Start(dir)
	if err != nil {
		t.Fatalf("start a shell in %s: %v", dir, err)
	}
	t.Cleanup(w.Stop)
	if !w.WaitCreated(0, 10*time.Second) {
		t.Fatalf("the shell in %s made no file", dir)
	}
	return w
}

type output Writer

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.out.Write(p)
}

// Stop kills the shell and waits for it; it may be called again.
func (w *Writer) Stop() {
	_ = w.cmd.Process.Kill()
	_ = w.cmd.Wait()
}

// Created returns the numbers of the files the shell reported made.
func (w *Writer) Created() []string {
	w.mu.Lock()
	s := w.out.String()
	w.mu.Unlock()
	return strings.Fields(s[:strings.LastIndexByte(s, '\n')+1])
}

// WaitCreated waits up to timeout until the shell has made more than n
// files, and reports whether it did.
func (w *Writer) WaitCreated(n int, timeout time.Duration) bool {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if len(w.Created()) > n {
			return true
		}
	}
	return false
}
