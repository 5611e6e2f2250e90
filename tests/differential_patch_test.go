package tests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// checkPatch applies the sandbox's `sbxfs diff --binary` with git apply
// to a copy of the original as git sees it (without FIFOs, devices and
// empty directories, which a patch cannot hold) and demands the files and
// symlinks the mount shows, with their content and executable bits.
// The differential tests run it at the end of every run (before the
// commit of TestDifferentialCommit).
func (r *diffRun) checkPatch() {
	r.t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		r.t.Logf("no git: the patch is not checked")
		return
	}
	patch := r.cliOutput("diff", "--binary", r.sb.mnt)
	work := filepath.Join(r.t.TempDir(), "applied")
	if out, err := exec.Command("cp", "-a", r.sb.orig, work).CombinedOutput(); err != nil {
		r.t.Fatalf("cp -a: %v\n%s", err, out)
	}
	if err := gitView(work); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	apply := exec.CommandContext(ctx, "git", "apply", "-")
	apply.Dir, apply.Stdin = work, bytes.NewReader(patch)
	out, err := apply.CombinedOutput()
	if err != nil {
		out, err = applyPastLoops(ctx, work, patch, out, err)
	}
	if err != nil {
		// git warns of every mode the patch names that git would not
		// ("has type 100644, expected 100640"): only its errors count.
		var errs []string
		for _, l := range strings.Split(string(out), "\n") {
			if !strings.HasPrefix(l, "warning: ") {
				errs = append(errs, l)
			}
		}
		r.fail("", "git apply of `sbxfs diff --binary` to a copy of the original: %v\n%s%s", err, strings.Join(errs, "\n"), r.keepPatch(patch))
	}
	want, err := gitFiles(r.sb.mnt)
	if err != nil {
		r.fail("", "walk the mount: %v", err)
	}
	got, err := gitFiles(work)
	if err != nil {
		r.t.Fatal(err)
	}
	var d []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			d = append(d, fmt.Sprintf("%q: missing (want %s)", p, w))
		} else if g != w {
			d = append(d, fmt.Sprintf("%q: %s, want %s", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			d = append(d, fmt.Sprintf("%q: %s, should not be there", p, g))
		}
	}
	if len(d) > 0 {
		slices.Sort(d)
		r.fail(strings.Join(d, " "), "the original patched with `sbxfs diff --binary` differs from the mount (want = mount):\n  %s%s",
			strings.Join(d[:min(len(d), 25)], "\n  "), r.keepPatch(patch))
	}
}

// applyPastLoops works around a limit of git apply: it cannot put a
// directory where the tree has a symlink that loops (a/b -> b), even with
// the symlink's deletion in the same patch (the paths beneath it give
// ELOOP, not ENOTDIR; a patch git diff makes fails alike). Where every
// error of the first try (out, err) is such a path, it applies the
// entries of those symlinks first, then the rest; else it returns the
// first try's outcome.
func applyPastLoops(ctx context.Context, work string, patch, out []byte, err error) ([]byte, error) {
	loops := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if l == "" || strings.HasPrefix(l, "warning: ") {
			continue
		}
		p, ok := strings.CutSuffix(strings.TrimPrefix(l, "error: "), ": Too many levels of symbolic links")
		if !ok {
			return out, err
		}
		found := false
		for q := path.Dir(p); q != "." && !found; q = path.Dir(q) {
			var st unix.Stat_t
			if unix.Lstat(filepath.Join(work, q), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK &&
				errors.Is(unix.Stat(filepath.Join(work, q), &st), unix.ELOOP) {
				loops[q], found = true, true
			}
		}
		if !found {
			return out, err
		}
	}
	if len(loops) == 0 {
		return out, err
	}
	var first, rest []string
	for q := range loops {
		first = append(first, "--include="+q)
		rest = append(rest, "--exclude="+q)
	}
	for _, args := range [][]string{first, rest} {
		apply := exec.CommandContext(ctx, "git", append([]string{"apply"}, append(args, "-")...)...)
		apply.Dir, apply.Stdin = work, bytes.NewReader(patch)
		if o, e := apply.CombinedOutput(); e != nil {
			return append(out, o...), e
		}
	}
	return nil, nil
}

// keepPatch writes the patch beside the history (-diff.history) and says
// where.
func (r *diffRun) keepPatch(patch []byte) string {
	if *flagDiffHistory == "" {
		return ""
	}
	p := *flagDiffHistory + ".patch"
	if err := os.WriteFile(p, patch, 0o644); err != nil {
		return fmt.Sprintf("\n(could not write the patch: %v)", err)
	}
	return "\n(the patch: " + p + ")"
}

// gitView removes from the tree at root what git does not hold: every
// object but directories, files and symlinks, then empty directories.
func gitView(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
			if p != root {
				dirs = append(dirs, p)
			}
		case !d.Type().IsRegular() && d.Type()&fs.ModeSymlink == 0:
			return os.Remove(p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- { // children before parents
		if ents, err := os.ReadDir(dirs[i]); err == nil && len(ents) == 0 {
			if err := os.Remove(dirs[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// gitFiles describes the files and symlinks beneath root as a patch
// carries them: content (a hash), the owner's execute bit, a target.
func gitFiles(root string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			out[rel] = "symlink to " + t
			return err
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file of %d bytes (sha256 %x) executable=%v", len(data), sha256.Sum256(data), info.Mode()&0o100 != 0)
		}
		return nil
	})
	return out, err
}

// cliOutput runs the sbxfs CLI (60 s at most) and returns what it wrote
// to stdout; the run fails, with its stderr, when the command does.
func (r *diffRun) cliOutput(args ...string) []byte {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, cliBin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		r.fail("", "sbxfs %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}
