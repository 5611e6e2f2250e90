package manager

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Close with DestroyOnExit destroys what this manager created, and only
// that; a second Close does nothing more (PITFALLS 27).
func TestDestroyOnExit(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	before := newFixture(t, m, "p", 1)
	require.NoError(t, m.Close())

	m, err := New(Options{StateRoot: root, DestroyOnExit: true, Logger: slog.New(&testHandler{t: t, strict: true})})
	require.NoError(t, err)
	mine := newFixture(t, m, "p", 2)
	require.NoError(t, m.Close())
	require.NoError(t, m.Close())

	m = open(t, root)
	assert.Equal(t, []State{Active}, before.states(t, m), "a sandbox another manager made stays")
	assert.Equal(t, repeat(CleanedUp, 2), mine.states(t, m))
	for _, id := range mine.ids {
		assert.NoDirExists(t, m.upper(id))
	}
	mine.allOld(t)
}

// SIGTERM with WatchSignals: the manager closes (destroying what it
// made), then the process dies of the signal as it would have.
func TestSignalDestroysOnExit(t *testing.T) {
	root := t.TempDir()
	orig := makeTree(t, fixtureFiles)
	raw, err := json.Marshal(childJob{Op: "signal", Root: root, Original: orig})
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSignalChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChild+"="+string(raw))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	id := ""
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "READY" {
			id = f[1]
			break
		}
	}
	require.NotEmpty(t, id, "the child is ready")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	ws := ee.Sys().(syscall.WaitStatus)
	assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGTERM, "dies of the signal: %v", err)

	m := open(t, root)
	sb, err := m.Get(id)
	require.NoError(t, err)
	assert.Equal(t, CleanedUp, sb.State)
	assert.NoDirExists(t, sb.Upper)
}

// TestSignalChild is the child of TestSignalDestroysOnExit.
func TestSignalChild(t *testing.T) {
	var job childJob
	if raw := os.Getenv(envChild); raw == "" || json.Unmarshal([]byte(raw), &job) != nil || job.Op != "signal" {
		t.Skip("runs only as the child of TestSignalDestroysOnExit")
	}
	m, err := New(Options{StateRoot: job.Root, DestroyOnExit: true, Logger: slog.New(&testHandler{t: t})})
	require.NoError(t, err)
	stop := m.WatchSignals()
	defer stop()
	sb, err := m.Create(ctx, CreateOptions{Original: job.Original})
	require.NoError(t, err)
	fmt.Printf("READY %s\n", sb.ID)
	time.Sleep(time.Minute)
	t.Fatal("no signal came")
}
