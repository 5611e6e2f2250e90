package tests

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A Python project's usual work in the mount: a virtual environment made
// with pip in it (ensurepip unpacks ~1,700 files), a package installed
// from a local wheel and upgraded (pip moves the old version aside to
// site-packages/~emo_ext* and removes it there once the new one is in),
// the tests run with unittest (the interpreter writes __pycache__/*.pyc
// by renaming a temporary file into place), everything byte-compiled, a
// module edited and imported again (the interpreter must see the new
// mtime and size and compile it anew, or it runs the old code). The same
// is done on a plain copy: every command prints the same and the trees
// are the same (the files that hold their own absolute path, such as the
// venv's scripts and the .pyc files, compared by name and, for text,
// with the path replaced; pip's RECORD files but for the scripts'
// hashes). The server compacts its journal every 4 KiB:
// pip's stash is gone from it. After sbxfs commit the original holds
// what the mount showed, and its virtual environment runs the tests.
func TestRealPythonProject(t *testing.T) {
	rtNeedCLI(t)
	python := rtNeedTool(t, "/usr/bin/python3", "python3")
	if out, err := exec.Command(python, "-m", "venv", filepath.Join(t.TempDir(), "v")).CombinedOutput(); err != nil {
		t.Skipf("%s -m venv does not work here (scripts/install-deps.sh installs python3-venv): %v\n%s", python, err, out)
	}
	wheels := t.TempDir()
	for _, v := range []string{"1.0", "2.0"} {
		pyWheel(t, wheels, "demo_ext", v, map[string]string{
			"demo_ext/__init__.py":    fmt.Sprintf("VERSION = %q\nfrom .core import double\n", v),
			"demo_ext/core.py":        fmt.Sprintf("def double(x):\n    return 2 * x  # %s\n", v),
			"demo_ext/data/words.txt": "alpha\nbeta\n",
		})
	}
	orig := newOrig(t, map[string]string{
		"proj/README":               "a project\n",
		"proj/src/demo/__init__.py": "from .util import triple\n",
		"proj/src/demo/util.py":     "def triple(x):\n    return 3 * x\n",
		"proj/tests/test_demo.py": `import unittest

import demo
import demo_ext


class TestDemo(unittest.TestCase):
    def test_triple(self):
        self.assertEqual(demo.triple(2), 6)

    def test_ext(self):
        self.assertEqual(demo_ext.VERSION, "2.0")
        self.assertEqual(demo_ext.double(21), 42)
`,
	})
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig, withServerEnv("SBXFS_JOURNAL_COMPACT=4096"))

	env := func(root string) []string {
		var env []string
		for _, kv := range rtBaseEnv() {
			if !strings.HasPrefix(kv, "PYTHON") && !strings.HasPrefix(kv, "PIP_") && !strings.HasPrefix(kv, "VIRTUAL_ENV=") {
				env = append(env, kv)
			}
		}
		return append(env, "HOME="+t.TempDir(), "PIP_CONFIG_FILE=/dev/null", "PIP_NO_INDEX=1", "PIP_NO_CACHE_DIR=1",
			"PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONPATH="+filepath.Join(root, "proj/src"))
	}
	work := func(side, root string) *rtShell {
		proj := filepath.Join(root, "proj")
		s := newRtShell(t, side, root, env(root))
		venvPy := filepath.Join(proj, ".venv/bin/python")
		s.run(proj, python, "-m", "venv", ".venv")
		for _, v := range []string{"1.0", "2.0"} {
			s.run(proj, venvPy, "-m", "pip", "install", filepath.Join(wheels, "demo_ext-"+v+"-py3-none-any.whl"))
		}
		s.run(proj, venvPy, "-m", "pip", "list", "--format=freeze")
		if out := s.run(proj, venvPy, "-m", "unittest", "discover", "-s", "tests", "-v"); !strings.Contains(out, "Ran 2 tests") || !strings.HasSuffix(out, "OK\n") {
			t.Errorf("[%s] unittest:\n%s", side, out)
		}
		s.run(proj, venvPy, "-m", "compileall", "-q", "src", "tests")
		if out := s.run(proj, venvPy, "-c", "import demo; print(demo.triple(2))"); out != "6\n" {
			t.Errorf("[%s] demo.triple(2) printed %q, want 6", side, out)
		}
		// A save of util.py with a new size: the cached .pyc no longer
		// matches, and the interpreter must notice.
		rtWrite(t, filepath.Join(proj, "src/demo/util.py"), "def triple(x):\n    return 3 * x\n\n\ndef name():\n    return \"edited\"\n", 0o644)
		if out := s.run(proj, venvPy, "-c", "import demo.util; print(demo.util.name())"); out != "edited\n" {
			t.Errorf("[%s] after the edit demo.util.name() printed %q, want edited (a stale .pyc ran?)", side, out)
		}
		return s
	}
	mount := work("mount", sb.mnt)
	plain := work("plain", ref)
	rtCompareLogs(t, plain, mount)

	// The files that name where they are (the venv's scripts and
	// pyvenv.cfg; every .pyc holds its source's path): the same names,
	// and the same text with the path replaced; the rest compared whole.
	want, got := mustWalk(t, ref, viewOpts), mustWalk(t, sb.mnt, viewOpts)
	for rel, g := range got {
		w, ok := want[rel]
		if !ok || g.Type != w.Type || g.Hash == w.Hash {
			continue
		}
		pb, _ := os.ReadFile(filepath.Join(ref, rel))
		mb, _ := os.ReadFile(filepath.Join(sb.mnt, rel))
		same := strings.HasSuffix(rel, ".pyc") && bytes.Contains(mb, []byte(sb.mnt)) && bytes.Contains(pb, []byte(ref)) ||
			filepath.Base(rel) == "RECORD" && pyRecordOutsideBin(pb) == pyRecordOutsideBin(mb) ||
			bytes.Equal(bytes.ReplaceAll(pb, []byte(ref), []byte("ROOT")), bytes.ReplaceAll(mb, []byte(sb.mnt), []byte("ROOT")))
		if same {
			g.Hash, g.Size = w.Hash, w.Size
			got[rel] = g
		}
	}
	rtCompareWalks(t, "the mount vs the plain copy after the work (paths in files replaced)", want, got)

	stash := func(p string) bool { return strings.Contains(p, "site-packages/~") }
	if left, _ := filepath.Glob(sb.path("proj/.venv/lib/python3*/site-packages/~*")); len(left) > 0 {
		t.Errorf("pip's stash is still in the mount: %q", left)
	}
	compactOnceMore(t, sb, sb.path("proj/README"))
	if named := keptPaths(t, sb, stash); len(named) > 0 {
		t.Errorf("the compacted journal still names pip's stash of the old version: %q", named)
	}

	rtCommit(t, sb, "python project")
	venvPy := filepath.Join(orig, "proj/.venv/bin/python")
	s := newRtShell(t, "original", orig, env(orig))
	if out := s.run(filepath.Join(orig, "proj"), venvPy, "-m", "unittest", "discover", "-s", "tests"); !strings.HasSuffix(out, "OK\n") {
		t.Errorf("the original's tests through its committed venv:\n%s", out)
	}
	out := s.run(filepath.Join(orig, "proj"), venvPy, "-c", "import sys, demo_ext; print(sys.prefix, demo_ext.VERSION)")
	if want := filepath.Join("ROOT", "proj/.venv") + " 2.0\n"; out != want {
		t.Errorf("the committed venv says %q, want %q", out, want)
	}
}

// pyRecordOutsideBin is a RECORD of an installed package without the
// hashes and sizes of its scripts in the venv's bin (their first line
// names the venv's python by its absolute path).
func pyRecordOutsideBin(record []byte) string {
	lines := strings.Split(string(record), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "../../../bin/") {
			lines[i], _, _ = strings.Cut(l, ",")
		}
	}
	return strings.Join(lines, "\n")
}

// pyWheel writes dir/NAME-VERSION-py3-none-any.whl: a pure-Python wheel
// holding files and its dist-info (METADATA, WHEEL, RECORD with hashes),
// which pip installs without an index or a build backend.
func pyWheel(t *testing.T, dir, name, version string, files map[string]string) {
	t.Helper()
	info := name + "-" + version + ".dist-info/"
	files[info+"METADATA"] = fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", strings.ReplaceAll(name, "_", "-"), version)
	files[info+"WHEEL"] = "Wheel-Version: 1.0\nGenerator: sbxfs-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	var record []string
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		w, err := z.Create(n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(files[n]))
		record = append(record, fmt.Sprintf("%s,sha256=%s,%d", n, base64.RawURLEncoding.EncodeToString(sum[:]), len(files[n])))
	}
	record = append(record, info+"RECORD,,")
	w, err := z.Create(info + "RECORD")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(strings.Join(record, "\n") + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-"+version+"-py3-none-any.whl"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
