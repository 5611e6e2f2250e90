package manager_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/sbxfs/sbxfs/layers"
	"github.com/sbxfs/sbxfs/manager"
)

// Example embeds sbxfs: a sandbox of a directory, mounted and served by
// this process, in which another process (an agent, an editor) works;
// the original stays as it was until the plan is committed, and the
// commit unmounts the sandbox. (A process that serves a mount must not
// also call into it: the work in the mount is a child process's.)
func Example() {
	dir, err := os.MkdirTemp("", "sbxfs-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	original := filepath.Join(dir, "app")
	if err := os.MkdirAll(original, 0o755); err != nil {
		fmt.Println(err)
		return
	}
	readme := filepath.Join(original, "README")
	if err := os.WriteFile(readme, []byte("v1\n"), 0o644); err != nil {
		fmt.Println(err)
		return
	}

	m, err := manager.New(manager.Options{
		StateRoot: filepath.Join(dir, "state"),
		Mount:     true,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	ctx := context.Background()
	sb, err := m.Create(ctx, manager.CreateOptions{Plan: "refactor", Original: original})
	if err != nil {
		fmt.Println(err)
		return
	}

	work := exec.Command("sh", "-c", "echo v2 > README && echo todo > NOTES")
	work.Dir = sb.Mountpoint
	if out, err := work.CombinedOutput(); err != nil {
		fmt.Println(err, string(out))
		return
	}
	before, _ := os.ReadFile(readme)
	fmt.Printf("original before the commit: %s", before)

	cfg, err := m.Config(sb.ID)
	if err != nil {
		fmt.Println(err)
		return
	}
	cs, err := layers.Changes(cfg) // what `sbxfs status` lists
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range cs.Changes {
		fmt.Println(c.Kind, c.Path)
	}

	res, err := m.CommitPlan(ctx, "refactor", manager.CommitOptions{Message: "the agent's work"})
	if err != nil {
		fmt.Println(err)
		return
	}
	after, _ := os.ReadFile(readme)
	fmt.Printf("original after the commit: %s", after)
	got, err := m.Get(sb.ID)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("committed:", res.Committed[0] == sb.ID, "state:", got.State, "mounted:", got.Mounted)

	// Output:
	// original before the commit: v1
	// created NOTES
	// modified README
	// original after the commit: v2
	// committed: true state: committed mounted: false
}
