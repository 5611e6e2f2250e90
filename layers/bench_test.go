package layers

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkChanges computes the change set of n = 1,000 and 20,000
// files written in 20 directories three deep, from the journal and those
// paths alone, its paths classified on one goroutine (workers=1) and as
// sbxfs does (workers=auto: up to 8 and GOMAXPROCS, 1,024 paths a
// goroutine at least: classifyAll). Run:
//
//	go test ./layers -run XXX -bench Changes -benchtime 10x
func BenchmarkChanges(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		lower := filepath.Join(b.TempDir(), "l")
		for i := 0; i < n; i++ {
			p := filepath.Join(lower, fmt.Sprintf("a/b%d/c", i%20), fmt.Sprintf("f%d", i))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		l := benchStack(b, lower)
		for i := 0; i < n; i++ {
			p := fmt.Sprintf("a/b%d/c/f%d", i%20, i)
			e, ok, err := l.resolve(p)
			if err != nil || !ok {
				b.Fatal(p, err)
			}
			fd, _, err := l.Open(p, &e.Obj, unix.O_WRONLY|unix.O_TRUNC, Caller{Pid: 1})
			if err != nil {
				b.Fatal(err)
			}
			_, err = unix.Write(fd, []byte("changed content"))
			if cerr := unix.Close(fd); err == nil {
				err = cerr
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		workers, perWorker := classifyWorkers, classifyPerWorker
		for _, w := range []struct {
			name           string
			workers, least int
		}{{"1", 1, 1024}, {"auto", min(8, runtime.GOMAXPROCS(0)), 1024}} {
			b.Run(fmt.Sprintf("n=%d/workers=%s", n, w.name), func(b *testing.B) {
				classifyWorkers, classifyPerWorker = w.workers, w.least
				defer func() { classifyWorkers, classifyPerWorker = workers, perWorker }()
				for i := 0; i < b.N; i++ {
					if _, err := l.Changes(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/path")
			})
		}
	}
}

// BenchmarkReplayRenames replays journals of n renames of files spread
// over 100 directories (an editor's saves, a mass rename, a branch
// switch): the time per rename must not grow with n (it did, n², before
// the path index: 14 s for 20,000). Run:
//
//	go test ./layers -run XXX -bench ReplayRenames
func BenchmarkReplayRenames(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		recs := make([]Record, 0, 2*n)
		for i := range n {
			p := fmt.Sprintf("d%d/f%d", i%100, i)
			recs = append(recs, Record{Op: OpWrite, Path: p}, Record{Op: OpRename, Path: p, Path2: p + ".renamed"})
		}
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				replay(recs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/rename")
		})
	}
}

// BenchmarkCompaction compacts journals of n records that rewrite the
// same 1,000 files again and again (a write, then times set), with one
// new file in 100: the work of one compaction, per record it reads, and
// the size it leaves. Run:
//
//	go test ./layers -run XXX -bench Compaction
func BenchmarkCompaction(b *testing.B) {
	for _, n := range []int{10000, 100000, 1000000} {
		data := journalHeader()
		for i := range n {
			r := Record{Op: OpWrite, Path: fmt.Sprintf("src/pkg%d/file%d.go", i%1000/50, i%1000)}
			switch {
			case i%100 == 0:
				r = Record{Op: OpCreate, Path: fmt.Sprintf("out/new%d", i/100)}
			case i%2 == 1:
				r = Record{Op: OpSetattr, Path: r.Path, Flags: AttrTimes}
			}
			data = appendRecord(data, &r)
		}
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			var body []byte
			for i := 0; i < b.N; i++ {
				var ok bool
				var err error
				if body, _, ok, err = compactRecords(data, time.Now(), nil); err != nil || !ok {
					b.Fatal(ok, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
			b.ReportMetric(float64(len(data))/float64(journalHeaderLen+len(body)), "x-smaller")
		})
	}
}

// BenchmarkLowerLookup looks up original files, 40 in each of 50
// directories, as LOOKUPs of a walk arrive: with the serving process's
// held directories (HoldLowerDirs) and without (each read opens its
// directory beneath the layer's root). Warm caches: what it measures is
// the server's system calls, not the disk. Run:
//
//	go test ./layers -run XXX -bench LowerLookup
func BenchmarkLowerLookup(b *testing.B) {
	lower := filepath.Join(b.TempDir(), "lower")
	for d := range 50 {
		for f := range 40 {
			p := filepath.Join(lower, fmt.Sprintf("d%d/e/f%d", d, f))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, held := range []bool{false, true} {
		b.Run(fmt.Sprintf("held=%v", held), func(b *testing.B) {
			l := benchStack(b, lower)
			if held {
				l.HoldLowerDirs(time.Second)
			}
			dirs := make([]Obj, 50)
			for d := range dirs {
				e, ok, err := l.resolve(fmt.Sprintf("d%d/e", d))
				if err != nil || !ok {
					b.Fatal(err)
				}
				dirs[d] = e.Obj
			}
			b.ResetTimer()
			for i := range b.N {
				d := i / 40 % 50
				if _, err := l.Lookup(fmt.Sprintf("d%d/e", d), dirs[d], fmt.Sprintf("f%d", i%40)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStat is the GETATTR of the serving process: a directory merged
// from the upper and the original (asked after every create or unlink in
// it), a file of the upper and a file of the original. Run:
//
//	go test ./layers -run XXX -bench 'Stat$'
func BenchmarkStat(b *testing.B) {
	lower := filepath.Join(b.TempDir(), "l")
	if err := os.MkdirAll(filepath.Join(lower, "a/b/d"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "a/b/d/orig"), []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	l := benchStack(b, lower)
	d, ok, err := l.resolve("a/b/d")
	if err != nil || !ok {
		b.Fatal(err)
	}
	fd, _, err := l.Create("a/b/d", d.Obj, "new", 0o644, Caller{Pid: 1})
	if err != nil {
		b.Fatal(err)
	}
	unix.Close(fd)
	for _, p := range []string{"a/b/d", "a/b/d/new", "a/b/d/orig"} {
		e, ok, err := l.resolve(p)
		if err != nil || !ok {
			b.Fatal(p, err)
		}
		b.Run(filepath.Base(p), func(b *testing.B) {
			for range b.N {
				if _, err := l.Stat(p, e.Obj); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchStack opens a stack over lower with a new upper and work directory,
// closed when the benchmark ends.
func benchStack(b *testing.B, lower string) *Layers {
	b.Helper()
	dir := b.TempDir()
	upper, work := filepath.Join(dir, "u"), filepath.Join(dir, "w")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	l, err := Open(Config{Upper: upper, Work: work, Lowers: []string{lower}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkGoneFromUpper asks the upper whether n = 20,000 dead paths
// (editor save files, 1,000 in each of 20 directories three deep) hold
// nothing, as a compaction and each read of the change set do before
// they drop them: half are gone, half still there. Run:
//
//	go test ./layers -run XXX -bench GoneFromUpper
func BenchmarkGoneFromUpper(b *testing.B) {
	const n = 20000
	lower := filepath.Join(b.TempDir(), "l")
	if err := os.MkdirAll(lower, 0o755); err != nil {
		b.Fatal(err)
	}
	l := benchStack(b, lower)
	paths := make([]string, n)
	for i := range paths {
		paths[i] = fmt.Sprintf("a/b%d/c/.f%d.swp", i%20, i)
		if i/20%2 == 0 {
			continue
		}
		p := filepath.Join(l.upper, paths[i])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(paths)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if gone := l.goneFromUpper(paths); len(slices.DeleteFunc(gone, func(g bool) bool { return !g })) != n/2 {
			b.Fatal("not half of the paths gone")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/path")
}
