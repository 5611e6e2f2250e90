package commit

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// BenchmarkCommit commits k modified files in originals of n files. The
// time per commit must not grow with n: a commit touches the k paths and
// their parents, never the tree. Run:
//
//	go test ./commit -run XXX -bench Commit -benchtime 20x
func BenchmarkCommit(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		orig := benchTree(b, n)
		unix.Sync() // the tree's creation must not be flushed inside a commit
		for _, k := range []int{10, 100, 1000} {
			if k > n {
				continue
			}
			b.Run(fmt.Sprintf("n=%d/k=%d", n, k), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					cfg := benchSandbox(b, orig, n/100, k, i)
					b.StartTimer()
					benchCommit(b, cfg)
					b.StopTimer()
					os.RemoveAll(filepath.Dir(cfg.Upper))
					b.StartTimer()
				}
			})
		}
	}
}

// benchTree makes an original of n files in directories of 100.
func benchTree(b *testing.B, n int) string {
	b.Helper()
	root := filepath.Join(b.TempDir(), "orig")
	for i := 0; i < n; i++ {
		dir := filepath.Join(root, fmt.Sprintf("d%04d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i%100)), []byte("original\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return root
}

// benchSandbox writes k files, spread over the tree, through the layers
// API (as the mount does) and returns the sandbox's config.
func benchSandbox(b *testing.B, orig string, dirs, k, round int) layers.Config {
	b.Helper()
	cfg, l := benchOpen(b, orig)
	defer l.Close()
	root, _ := l.Root()
	for j := 0; j < k; j++ {
		d, f := fmt.Sprintf("d%04d", j%dirs), fmt.Sprintf("f%03d", j/dirs)
		de, err := l.Lookup("", root.Obj, d)
		if err != nil {
			b.Fatal(err)
		}
		fe, err := l.Lookup(d, de.Obj, f)
		if err != nil {
			b.Fatal(err)
		}
		fd, _, err := l.Open(d+"/"+f, &fe.Obj, unix.O_WRONLY|unix.O_TRUNC, layers.Caller{})
		if err != nil {
			b.Fatal(err)
		}
		unix.Write(fd, []byte(fmt.Sprintf("round %d\n", round)))
		unix.Close(fd)
	}
	unix.Sync() // the sandbox's writes are not the commit's to flush
	return cfg
}

// BenchmarkCommitNewTree commits a tree the sandbox made (the shape of
// an `npm install`): k new files in directories of 100, under one new
// directory of an original of 1,000 files. Run:
//
//	go test ./commit -run XXX -bench CommitNewTree -benchtime 3x
func BenchmarkCommitNewTree(b *testing.B) {
	orig := benchTree(b, 1000)
	unix.Sync()
	for _, k := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				cfg := benchNewTree(b, orig, k, i)
				b.StartTimer()
				benchCommit(b, cfg)
				b.StopTimer()
				os.RemoveAll(filepath.Dir(cfg.Upper))
				os.RemoveAll(filepath.Join(orig, fmt.Sprintf("new%d", i)))
				unix.Sync()
				b.StartTimer()
			}
		})
	}
}

// benchNewTree makes new<round>/dNNNN/fNN: k new files through the
// layers API.
func benchNewTree(b *testing.B, orig string, k, round int) layers.Config {
	b.Helper()
	cfg, l := benchOpen(b, orig)
	defer l.Close()
	root, _ := l.Root()
	top := fmt.Sprintf("new%d", round)
	te, err := l.Mkdir("", root.Obj, top, 0o755, layers.Caller{})
	if err != nil {
		b.Fatal(err)
	}
	var de layers.Entry
	var d string
	for j := 0; j < k; j++ {
		if j%100 == 0 {
			d = fmt.Sprintf("d%04d", j/100)
			if de, err = l.Mkdir(top, te.Obj, d, 0o755, layers.Caller{}); err != nil {
				b.Fatal(err)
			}
		}
		fd, _, err := l.Create(top+"/"+d, de.Obj, fmt.Sprintf("f%02d", j%100), 0o644, layers.Caller{})
		if err != nil {
			b.Fatal(err)
		}
		unix.Write(fd, []byte("new\n"))
		unix.Close(fd)
	}
	unix.Sync()
	return cfg
}

// benchOpen makes an empty sandbox of orig beside it and opens its layers.
func benchOpen(b *testing.B, orig string) (layers.Config, *layers.Layers) {
	b.Helper()
	dir, err := os.MkdirTemp(filepath.Dir(orig), "sb")
	if err != nil {
		b.Fatal(err)
	}
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{orig}}
	os.Mkdir(cfg.Upper, 0o700)
	os.Mkdir(cfg.Work, 0o700)
	l, err := layers.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return cfg, l
}

// benchCommit prepares and commits the sandbox cfg.
func benchCommit(b *testing.B, cfg layers.Config) {
	b.Helper()
	x, err := Prepare(cfg, Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := Commit(x); err != nil {
		b.Fatal(err)
	}
}
