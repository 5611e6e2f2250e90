package manager

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// BenchmarkPlanCommit commits a plan of 16 sandboxes with 100 changed
// files each (on disk, no mounts: the commit is what is measured).
//
//	go test ./manager -run XXX -bench PlanCommit -benchtime 5x
func BenchmarkPlanCommit(b *testing.B) {
	ctx := context.Background()
	root := b.TempDir()
	m, err := New(Options{StateRoot: filepath.Join(root, "state"), Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	var origs []string
	for s := 0; s < 16; s++ {
		o := filepath.Join(root, fmt.Sprintf("orig%02d", s))
		if err := os.MkdirAll(o, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := 0; f < 100; f++ {
			if err := os.WriteFile(filepath.Join(o, fmt.Sprintf("f%03d", f)), []byte("old\n"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		origs = append(origs, o)
	}
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		plan := fmt.Sprintf("p%d", i)
		for _, o := range origs {
			sb, err := m.Create(ctx, CreateOptions{Plan: plan, Original: o})
			if err != nil {
				b.Fatal(err)
			}
			cfg, err := m.Config(sb.ID)
			if err != nil {
				b.Fatal(err)
			}
			benchWrite(b, cfg, 100, i)
		}
		unix.Sync()
		b.StartTimer()
		if _, err := m.CommitPlan(ctx, plan, CommitOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateDestroy creates and destroys 200 sandboxes (on disk).
func BenchmarkCreateDestroy(b *testing.B) {
	ctx := context.Background()
	root := b.TempDir()
	orig := filepath.Join(root, "orig")
	if err := os.MkdirAll(orig, 0o755); err != nil {
		b.Fatal(err)
	}
	m, err := New(Options{StateRoot: filepath.Join(root, "state"), Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	for i := 0; i < b.N; i++ {
		var ids []string
		for s := 0; s < 200; s++ {
			sb, err := m.Create(ctx, CreateOptions{Plan: "p", Original: orig})
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, sb.ID)
		}
		for _, id := range ids {
			if err := m.Destroy(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// benchWrite rewrites k files of the sandbox through the layers API.
func benchWrite(b *testing.B, cfg layers.Config, k, round int) {
	b.Helper()
	l, err := layers.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	root, _ := l.Root()
	for f := 0; f < k; f++ {
		name := fmt.Sprintf("f%03d", f)
		e, err := l.Lookup("", root.Obj, name)
		if err != nil {
			b.Fatal(err)
		}
		fd, _, err := l.Open(name, &e.Obj, unix.O_WRONLY|unix.O_TRUNC, layers.Caller{})
		if err != nil {
			b.Fatal(err)
		}
		unix.Write(fd, []byte(fmt.Sprintf("round %d\n", round)))
		unix.Close(fd)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
