package manager

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNestedWriteDuringTheCommitIsKept: sandbox B is of A's mount, both
// in one plan; B replaces f. Another process holds A's f open for
// writing, and writes through it once B's apply moved that f into B's
// backups (A's mount is not frozen while B's level commits). In a flat
// plan such a write is a conflict and the plan is undone
// (TestCommitPlanWriteDuringTheCommit); B's commit into A must check its
// backups too, before the plan record marks it done. Until 2026-11-28
// the check came after the mark, its conflict was dropped, and the
// write went with the backups (found by review). The mounts are served
// by this process; the other writer is a child process.
func TestNestedWriteDuringTheCommitIsKept(t *testing.T) {
	needRoot(t)
	orig := makeTree(t, map[string]string{"f": "old\n", "k": "k\n"})
	m, err := New(Options{StateRoot: t.TempDir(), Mount: true, Logger: slog.New(&testHandler{t: t})})
	require.NoError(t, err)
	defer m.Close()
	a, err := m.Create(ctx, CreateOptions{Plan: "p", Original: orig})
	require.NoError(t, err)
	b, err := m.Create(ctx, CreateOptions{Plan: "p", Original: a.Mountpoint})
	require.NoError(t, err)

	other := exec.Command("bash", "-c", `exec 3<>"$1"; printf 'old\n' >&3; echo open; read -r _; printf 'other writer\n' >&3; echo wrote; read -r _`, "other", filepath.Join(a.Mountpoint, "f"))
	in, err := other.StdinPipe()
	require.NoError(t, err)
	outPipe, err := other.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, other.Start())
	defer func() { _ = in.Close(); _ = other.Wait() }()
	out := bufio.NewReader(outPipe)
	line := func() string {
		s, err := out.ReadString('\n')
		require.NoError(t, err)
		return strings.TrimSpace(s)
	}
	require.Equal(t, "open", line(), "the other writer holds A's f open (copied up in A)")
	require.NoError(t, os.WriteFile(filepath.Join(b.Mountpoint, "f"), []byte("child\n"), 0o644))

	_, err = m.CommitPlan(ctx, "p", CommitOptions{Fault: func(p string) {
		if p == "applied-0" { // B applied into A's mount, not yet marked done
			_, werr := io.WriteString(in, "go\n")
			require.NoError(t, werr)
			require.Equal(t, "wrote", line())
		}
	}})
	require.Error(t, err, "a write to what the child's commit backed up is a conflict")
	assert.Contains(t, err.Error(), "changed in the original during the commit")
	assert.Equal(t, "old\nother writer\n", readFile(t, a.Mountpoint, "f"), "the write is kept in A")
	assert.Equal(t, "child\n", readFile(t, b.Mountpoint, "f"), "B keeps its change")
	assert.Equal(t, "old\n", readFile(t, orig, "f"))
}
