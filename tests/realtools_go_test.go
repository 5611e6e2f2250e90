package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// rtGoModule is a small real module: a command, an internal package, a
// package with a table test, a test that reads testdata, and an example.
// nonce goes into the sources so no earlier run's build cache serves it.
func rtGoModule(nonce string) map[string]string {
	return map[string]string{
		"app/go.mod": "module example.com/app\n\ngo 1.22\n",
		"app/cmd/app/main.go": `package main

import (
	"fmt"
	"os"

	"example.com/app/internal/calc"
	"example.com/app/pkg/greet"
)

func main() {
	who := "sandbox"
	if len(os.Args) > 1 {
		who = os.Args[1]
	}
	fmt.Println(greet.Hello(who))
	fmt.Println("sum:", calc.Sum(1, 2, 3, 4), "fib:", calc.Fib(20))
}
`,
		"app/cmd/tool/main.go": `package main

import (
	"fmt"

	"example.com/app/internal/calc"
)

func main() { fmt.Println("tool", calc.Fib(10), calc.Nonce) }
`,
		"app/internal/calc/calc.go": fmt.Sprintf(`// Package calc adds and counts.
package calc

// Nonce makes this build unlike any cached one.
const Nonce = %q

// Sum adds its arguments.
func Sum(xs ...int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// Fib is the n-th Fibonacci number.
func Fib(n int) int {
	a, b := 0, 1
	for range n {
		a, b = b, a+b
	}
	return a
}
`, nonce),
		"app/internal/calc/calc_test.go": `package calc

import (
	"os"
	"strings"
	"testing"
)

func TestSum(t *testing.T) {
	for _, c := range []struct{ in []int; want int }{{nil, 0}, {[]int{1}, 1}, {[]int{1, 2, 3}, 6}} {
		if got := Sum(c.in...); got != c.want {
			t.Errorf("Sum(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestFibTable(t *testing.T) {
	b, err := os.ReadFile("testdata/fib.txt")
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range strings.Fields(string(b)) {
		if got := Fib(i); itoa(got) != f {
			t.Errorf("Fib(%d) = %d, want %s", i, got, f)
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var s []byte
	for ; n > 0; n /= 10 {
		s = append([]byte{byte('0' + n%10)}, s...)
	}
	return string(s)
}
`,
		"app/internal/calc/testdata/fib.txt": "0 1 1 2 3 5 8 13 21 34 55\n",
		"app/pkg/greet/greet.go": `// Package greet greets.
package greet

import "strings"

// Hello greets who.
func Hello(who string) string { return "hello, " + strings.TrimSpace(who) + "!" }
`,
		"app/pkg/greet/greet_test.go": `package greet_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"example.com/app/pkg/greet"
)

func TestHello(t *testing.T) {
	if got := greet.Hello(" you "); got != "hello, you!" {
		t.Fatalf("got %q", got)
	}
}

// TestTempDir writes, renames and removes files in a temporary
// directory (GOTMPDIR/TMPDIR may be in the sandbox).
func TestTempDir(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "x")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p, p+"2"); err != nil {
		t.Fatal(err)
	}
}

func ExampleHello() {
	fmt.Println(greet.Hello("example"))
	// Output: hello, example!
}
`,
	}
}

// TestRealGoBuild: go mod tidy, go vet, go build, go test, go test -c and
// go install of a small real module in the mount (GOTOOLCHAIN=local, no
// network; GOCACHE is the user's, outside the mount, as usual; the go
// command's work directory, GOTMPDIR, is in the mount, so the compiler and
// linker write there and go test runs its test binaries from there), then
// an edit and an incremental rebuild. The binaries built in the mount run
// and print what they should; the same is done on a plain copy: every
// command prints the same and the trees are the same but for the
// binaries. After sbxfs commit the original holds the binaries built in
// the mount, and they run.
func TestRealGoBuild(t *testing.T) {
	rtNeedCLI(t)
	goBin := goTool()
	if _, err := os.Stat(goBin); err != nil {
		t.Skipf("no go tool: %v", err)
	}
	nonce := fmt.Sprintf("run-%d", time.Now().UnixNano())
	orig := newOrig(t, rtGoModule(nonce))
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig)
	gopath := t.TempDir()
	timeRE := regexp.MustCompile(`\t[0-9.]+s\n`)

	work := func(side, root string) *rtShell {
		app := filepath.Join(root, "app")
		gotmp := filepath.Join(root, ".gotmp")
		if err := os.Mkdir(gotmp, 0o755); err != nil {
			t.Fatal(err)
		}
		s := newRtShell(t, side, root, rtBaseEnv(
			"GOTOOLCHAIN=local", "GOFLAGS=-mod=mod -buildvcs=false", "GOPROXY=off", "GOSUMDB=off",
			"GOPATH="+gopath, "GOTMPDIR="+gotmp, "TMPDIR="+gotmp, "GOBIN="+filepath.Join(root, "gobin")))
		s.run(app, goBin, "mod", "tidy")
		s.run(app, goBin, "vet", "./...")
		s.run(app, goBin, "build", "./...")
		s.run(app, goBin, "build", "-o", "bin/app", "./cmd/app")
		s.run(app, filepath.Join(app, "bin/app"))
		s.run(app, filepath.Join(app, "bin/app"), "gopher")
		out := s.run(app, goBin, "test", "-count=1", "./...")
		s.log[len(s.log)-1] = timeRE.ReplaceAllString(s.log[len(s.log)-1], "\tTIME\n")
		if !strings.Contains(out, "ok  \texample.com/app/internal/calc") || !strings.Contains(out, "ok  \texample.com/app/pkg/greet") {
			t.Errorf("[%s] go test output lacks the ok lines:\n%s", side, out)
		}
		s.run(app, goBin, "test", "-c", "-o", "bin/calc.test", "./internal/calc")
		out = s.run(filepath.Join(app, "internal/calc"), filepath.Join(app, "bin/calc.test"), "-test.v", "-test.count=1")
		s.log[len(s.log)-1] = regexp.MustCompile(`\([0-9.]+s\)`).ReplaceAllString(s.log[len(s.log)-1], "(TIME)")
		if !strings.Contains(out, "--- PASS: TestFibTable") {
			t.Errorf("[%s] calc.test output:\n%s", side, out)
		}
		s.run(app, goBin, "install", "./cmd/tool")
		s.run(app, filepath.Join(root, "gobin/tool"))
		// An edit and an incremental rebuild over the old binary.
		p := filepath.Join(app, "pkg/greet/greet.go")
		src := strings.Replace(mustRead(t, p), `"hello, "`, `"hi, "`, 1)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		s.run(app, goBin, "build", "-o", "bin/app", "./cmd/app")
		out = s.run(app, filepath.Join(app, "bin/app"))
		if !strings.HasPrefix(out, "hi, sandbox!\nsum: 10 fib: 6765\n") {
			t.Errorf("[%s] bin/app after the rebuild printed %q", side, out)
		}
		out = s.run(app, goBin, "test", "-count=1", "-run", "TestTempDir", "./pkg/greet")
		s.log[len(s.log)-1] = timeRE.ReplaceAllString(s.log[len(s.log)-1], "\tTIME\n")
		if !strings.HasPrefix(out, "ok  ") {
			t.Errorf("[%s] go test after the edit: %s", side, out)
		}
		return s
	}
	// The mount first, so nothing it builds can come from the plain
	// copy's builds through the cache.
	mount := work("mount", sb.mnt)
	plain := work("plain", ref)
	rtCompareLogs(t, plain, mount)

	if ents := listDir(t, sb.path(".gotmp")); len(ents) != 0 {
		t.Errorf("the go command left %q in its work directory in the mount", ents)
	}
	bins := []string{"app/bin/app", "app/bin/calc.test", "gobin/tool"}
	// The binaries hold their source paths, which differ between the two
	// sides (-trimpath would make them equal, but costs a build of the
	// standard library on a cold cache); everything else is the same.
	isBin := func(rel string) bool { return slices.Contains(bins, rel) }
	rtCompareTrees(t, "the mount vs the plain copy after the builds (binaries left out)", ref, sb.mnt, viewOpts, isBin)

	want := map[string]string{}
	for _, b := range bins {
		h, err := hashFile(sb.path(b))
		if err != nil {
			t.Fatalf("built binary %s: %v", b, err)
		}
		want[b] = h
	}
	rtCommit(t, sb, "go build")
	for _, b := range bins {
		h, err := hashFile(filepath.Join(orig, b))
		if err != nil || h != want[b] {
			t.Errorf("%s in the original after the commit: hash %s (%v), want %s as in the mount", b, h, err, want[b])
		}
		st := lstat(t, filepath.Join(orig, b))
		if st.Mode&0o111 == 0 {
			t.Errorf("%s in the original is not executable: mode %#o", b, st.Mode&0o7777)
		}
	}
	out, err := newRtShell(t, "original", orig, rtBaseEnv()).try(orig, nil, filepath.Join(orig, "app/bin/app"), "original")
	if err != nil || out != "hi, original!\nsum: 10 fib: 6765\n" {
		t.Errorf("the committed app/bin/app printed %q (%v)", out, err)
	}
	rtCompareTrees(t, "the original after the commit vs the plain copy (binaries left out)", ref, orig, viewOpts, isBin)
}
