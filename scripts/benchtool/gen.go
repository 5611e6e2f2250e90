package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The originals are generated once per run, deterministically (fixed
// seeds), on the scratch disk, and shared by every target.

// text is a pool of printable lines that file contents are cut from.
var text = func() []byte {
	r := rand.New(rand.NewPCG(1, 2))
	words := []string{"sandbox", "overlay", "upper", "lower", "commit", "journal", "copy", "func",
		"return", "err", "nil", "if", "for", "range", "struct", "path", "file", "dir", "int", "string"}
	var b strings.Builder
	for b.Len() < 256<<10 {
		n := 3 + r.IntN(9)
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[r.IntN(len(words))])
		}
		b.WriteByte('\n')
	}
	return []byte(b.String())
}()

// content returns size bytes of text starting at a seed-dependent place.
func content(r *rand.Rand, size int) []byte {
	if size > len(text) {
		size = len(text)
	}
	off := r.IntN(len(text) - size + 1)
	return text[off : off+size]
}

// oldTime is the mtime given to generated files (git sees no racy entries).
var oldTime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// genFiles writes n files spread over dirs directories under root
// (grouped 25 directories to a parent when there are more than 25), with
// sizes from lo to hi bytes, and returns their relative paths.
func genFiles(root string, n, dirs, lo, hi int, seed uint64) ([]string, error) {
	r := rand.New(rand.NewPCG(seed, 7))
	var paths []string
	for d := 0; d < dirs; d++ {
		dir := fmt.Sprintf("d%03d", d)
		if dirs > 25 {
			dir = fmt.Sprintf("p%02d/d%03d", d/25, d)
		}
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			return nil, err
		}
		per := n / dirs
		if d < n%dirs {
			per++
		}
		for f := 0; f < per; f++ {
			rel := fmt.Sprintf("%s/f%04d.txt", dir, f)
			if err := os.WriteFile(filepath.Join(root, rel), content(r, lo+r.IntN(hi-lo+1)), 0o644); err != nil {
				return nil, err
			}
			paths = append(paths, rel)
		}
	}
	return paths, nil
}

// need generates the named original (once) and returns its path.
func (e *env) need(name string) (string, error) {
	p := filepath.Join(e.orig, name)
	if name == "tar" {
		p = filepath.Join(e.work, "small.tar")
	}
	if e.generated[name] {
		return p, nil
	}
	start := time.Now()
	var err error
	switch {
	case name == "meta":
		e.metaFiles, err = genFiles(p, e.sz.metaFiles, e.sz.metaDirs, 0, 4096, 1)
	case name == "empty":
		err = os.MkdirAll(p, 0o755)
	case name == "copyup":
		e.copyupFiles, err = genFiles(p, e.sz.copyupFiles, max(1, e.sz.copyupFiles/50), 1024, 16384, 2)
	case name == "tar":
		err = e.genTar(p)
	case name == "data":
		err = e.genData(p)
	case name == "git":
		err = e.genGit(p)
	case name == "gomod":
		err = genGoModule(p, e.sz.goPkgs, e.sz.goFiles)
	case strings.HasPrefix(name, "life-"):
		var n int
		fmt.Sscanf(name, "life-%d", &n)
		err = genLife(p, n)
	case strings.HasPrefix(name, "plan-"):
		_, err = genFiles(p, e.sz.planFiles, 1, 8, 64, 3)
	default:
		err = fmt.Errorf("no original %q", name)
	}
	if err != nil {
		return "", fmt.Errorf("generate %s: %w", name, err)
	}
	unix.Sync() // its writeback must not land in a measurement
	e.generated[name] = true
	e.logf("generated %s in %s", name, time.Since(start).Round(time.Millisecond))
	return p, nil
}

// genTar makes the small-files tarball: tarFiles files of 100 B to 16 KiB
// in directories of 100.
func (e *env) genTar(tarball string) error {
	stage := filepath.Join(e.work, "tar-stage")
	if _, err := genFiles(filepath.Join(stage, "pkg"), e.sz.tarFiles, max(1, e.sz.tarFiles/100), 100, 16384, 4); err != nil {
		return err
	}
	if err := e.cmdIn(stage, nil, "tar", "-cf", tarball, "pkg"); err != nil {
		return err
	}
	return os.RemoveAll(stage)
}

// genData writes big.bin (dataMiB) and rand.bin (randMiB).
func (e *env) genData(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeBig(filepath.Join(dir, "big.bin"), e.sz.dataMiB, false); err != nil {
		return err
	}
	return writeBig(filepath.Join(dir, "rand.bin"), e.sz.randMiB, false)
}

// writeBig writes mib MiB of incompressible data in 1 MiB writes,
// fsyncing at the end when sync is set.
func writeBig(path string, mib int, sync bool) error {
	return writeChunked(path, mib, 1<<20, sync)
}

// writeChunked writes mib MiB of pseudo-random data to a new file at path
// in writes of chunk bytes (a divisor of 1 MiB), then fsyncs it if sync.
func writeChunked(path string, mib, chunk int, sync bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(uint64(mib), 9))
	for i := 0; i < len(buf); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			buf[i+j] = byte(v >> (8 * j))
		}
	}
	for i := 0; i < mib; i++ {
		buf[0], buf[1] = byte(i), byte(i>>8) // every MiB differs
		for off := 0; off < len(buf); off += chunk {
			if _, err := f.Write(buf[off : off+chunk]); err != nil {
				f.Close()
				return err
			}
		}
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// genLife makes an original of n small files in directories of 100, as
// commit/bench_test.go does.
func genLife(root string, n int) error {
	for i := 0; i < n; i++ {
		dir := filepath.Join(root, fmt.Sprintf("d%04d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i%100)), []byte("original\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// lifePath is the j-th file touched in a life tree: the first directories
// filled in order, so that k touched files are the same paths in the same
// directories whatever the tree's size n, and only n changes between the
// columns of a row. (commit/bench_test.go spreads them over all the
// directories instead, which also makes the number of touched directories
// grow with n.)
func lifePath(j int) string {
	return fmt.Sprintf("d%04d/f%03d", j/100, j%100)
}

// gitEnv is the environment of every git command: no user or system
// configuration, fixed identity and dates.
func (e *env) gitEnv() []string {
	home := filepath.Join(e.work, "home")
	os.MkdirAll(home, 0o755)
	return append(os.Environ(),
		"HOME="+home, "XDG_CONFIG_HOME="+home, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@example.invalid",
		"GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@example.invalid",
		"GIT_AUTHOR_DATE=2024-01-02T03:04:05Z", "GIT_COMMITTER_DATE=2024-01-02T03:04:05Z",
	)
}

// genGit makes a repository of gitFiles committed files (mtimes in the
// past, so no entry is racily clean), packed, with a fresh index.
func (e *env) genGit(repo string) error {
	files, err := genFiles(repo, e.sz.gitFiles, max(1, e.sz.gitFiles/50), 200, 4096, 5)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := os.Chtimes(filepath.Join(repo, f), oldTime, oldTime); err != nil {
			return err
		}
	}
	e.gitFiles = files
	env := e.gitEnv()
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"config", "gc.auto", "0"},
		{"add", "-A"},
		{"commit", "-q", "-m", "initial"},
		{"gc", "-q"},
		{"status", "--porcelain"},
	} {
		if err := e.cmdIn(repo, env, "git", args...); err != nil {
			return err
		}
	}
	return nil
}

// genGoModule writes a module of pkgs library packages of files files
// each (no standard library imports, so a fresh GOCACHE compiles only
// these); package i imports package (i-1)/2.
func genGoModule(root string, pkgs, files int) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module bench.example/gen\n\ngo 1.22\n"), 0o644); err != nil {
		return err
	}
	for p := 0; p < pkgs; p++ {
		dir := filepath.Join(root, fmt.Sprintf("pkg%02d", p))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for f := 0; f < files; f++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("file%02d.go", f)), goFile(p, f), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// goFile is one generated source file: a type, methods and functions
// with loops and a switch, about 150 lines.
func goFile(p, f int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "package pkg%02d\n\n", p)
	if p > 0 && f == 0 {
		fmt.Fprintf(&b, "import dep \"bench.example/gen/pkg%02d\"\n\n", (p-1)/2)
		fmt.Fprintf(&b, "// Dep uses the imported package.\nfunc Dep(x int) int { return dep.F00_0(x) + 1 }\n\n")
	}
	fmt.Fprintf(&b, "// T%02d is a generated type.\ntype T%02d struct {\n\tA, B int\n\tS    []int\n\tM    map[int]string\n}\n\n", f, f)
	for m := 0; m < 6; m++ {
		fmt.Fprintf(&b, "// M%d is a generated method.\nfunc (t *T%02d) M%d(n int) int {\n", m, f, m)
		fmt.Fprintf(&b, "\tsum := t.A\n\tfor i := 0; i < n; i++ {\n\t\tswitch i %% %d {\n", m+2)
		for c := 0; c < m+2; c++ {
			fmt.Fprintf(&b, "\t\tcase %d:\n\t\t\tsum += i * %d\n", c, c+m)
		}
		fmt.Fprintf(&b, "\t\t}\n\t\tt.S = append(t.S, sum)\n\t}\n\treturn sum + t.B\n}\n\n")
	}
	for fn := 0; fn < 4; fn++ {
		fmt.Fprintf(&b, "// F%02d_%d is a generated function.\nfunc F%02d_%d(x int) int {\n", f, fn, f, fn)
		fmt.Fprintf(&b, "\tt := &T%02d{A: x, B: %d, M: map[int]string{}}\n", f, fn)
		fmt.Fprintf(&b, "\tfor i := 0; i < %d; i++ {\n\t\tt.M[i] = \"v\"\n\t}\n", fn+3)
		fmt.Fprintf(&b, "\treturn t.M%d(x) + len(t.M)\n}\n\n", fn%6)
	}
	return []byte(b.String())
}
