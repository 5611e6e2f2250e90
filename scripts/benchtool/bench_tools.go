package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// benchGit: git status first (cold, fresh mount) and warm, then a branch,
// edits, git add -A and a commit.
func (e *env) benchGit(t *target, rep int) (err error) {
	repo, err := e.need("git")
	if err != nil {
		return err
	}
	in, err := e.open(t, repo, modify)
	if err != nil {
		return err
	}
	defer closeInto(in, &err)
	env := e.gitEnv()
	git := func(args ...string) (float64, error) { return e.timeCmd(in.path, env, "git", args...) }
	if t.onTree() {
		// cp -a gave every file a new inode and ctime: refresh the copy's
		// index first, as the original's is.
		if _, err := git("status", "--porcelain"); err != nil {
			return err
		}
	}
	if err := e.cold(in); err != nil {
		return err
	}
	out, err := e.output(in.path, env, "git", "status", "--porcelain")
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) != "" {
		return fmt.Errorf("git status of the untouched repository is not clean: %.200s", out)
	}
	if err := e.cold(in); err != nil { // the check above warmed it
		return err
	}
	d, err := git("status", "--porcelain")
	if err != nil {
		return err
	}
	e.res.add("git", "status.first", t.name, d)
	if d, err = medianOf(3, func() (float64, error) { return git("status", "--porcelain") }); err != nil {
		return err
	}
	e.res.add("git", "status.warm", t.name, d)
	d, err = timeFn(func() error {
		if _, err := git("checkout", "-q", "-b", "bench"); err != nil {
			return err
		}
		step := max(1, len(e.gitFiles)/e.sz.gitEdits)
		for i := 0; i < e.sz.gitEdits; i++ {
			f, err := os.OpenFile(filepath.Join(in.path, e.gitFiles[i*step%len(e.gitFiles)]), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(f, "edited in round %d\n", rep)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
		if _, err := git("add", "-A"); err != nil {
			return err
		}
		_, err := git("commit", "-q", "-m", "edit")
		return err
	})
	if err != nil {
		return err
	}
	e.res.add("git", "commit", t.name, d)
	return nil
}

// benchGoBuild: go build ./... of the generated module with an empty
// GOCACHE, offline, with the local toolchain.
func (e *env) benchGoBuild(t *target, rep int) (err error) {
	mod, err := e.need("gomod")
	if err != nil {
		return err
	}
	goEnv := func(cache string) []string {
		return append(os.Environ(), "GOCACHE="+cache, "GOTOOLCHAIN=local", "GOPROXY=off", "GOFLAGS=",
			"GOWORK=off", "GO111MODULE=on", "GOENV=off", "GOPATH="+filepath.Join(e.work, "gopath"))
	}
	if t == e.targets[rep%len(e.targets)] {
		// The rep's first target: build once on the original with a
		// throwaway cache, so the toolchain's binaries and the sources
		// are in the page cache for every target alike.
		cache := filepath.Join(e.work, "gocache-warm")
		_, err := e.timeCmd(mod, goEnv(cache), e.goBin, "build", "./...")
		os.RemoveAll(cache)
		if err != nil {
			return err
		}
	}
	in, err := e.open(t, mod, readOnly)
	if err != nil {
		return err
	}
	defer closeInto(in, &err)
	cache := filepath.Join(e.work, fmt.Sprintf("gocache-%d", e.seq))
	defer os.RemoveAll(cache)
	d, err := e.timeCmd(in.path, goEnv(cache), e.goBin, "build", "./...")
	if err != nil {
		return err
	}
	e.res.add("gobuild", "build", t.name, d)
	return nil
}
