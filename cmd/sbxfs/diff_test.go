package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDiffMountedSandbox(t *testing.T) {
	requireFuse(t)
	t.Parallel()
	bin := sbxfsBin(t)
	f := newFixture(t)
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "del.txt"), []byte("bye\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(f.orig, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(f.orig, "d", "f.txt"), []byte("in d\n"), 0o644))

	r := runBin(t, bin, "mount", "--upper", f.dir, f.orig, f.mnt)
	require.Equal(t, 0, r.code, r.stderr)

	r = runBin(t, bin, "diff", "--exit-code", f.mnt)
	assert.Equal(t, 0, r.code, "no changes yet")
	assert.Empty(t, r.stdout)

	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "a.txt"), []byte("hello\nworld\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "new.txt"), []byte("new\n"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(f.mnt, "del.txt")))
	require.NoError(t, os.Rename(filepath.Join(f.mnt, "d"), filepath.Join(f.mnt, "e")))

	r = runBin(t, bin, "diff", f.mnt)
	require.Equal(t, 0, r.code, "changes do not fail a plain diff: %s", r.stderr)
	for _, want := range []string{
		"diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1,2 @@\n hello\n+world\n",
		"diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+new\n",
		"diff --git a/del.txt b/del.txt\ndeleted file mode 100644\n--- a/del.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n",
		"renamed directory d -> e\ndiff --git a/d/f.txt b/e/f.txt\nsimilarity index 100%\nrename from d/f.txt\nrename to e/f.txt\n",
	} {
		assert.Contains(t, r.stdout, want)
	}

	r = runBin(t, bin, "diff", "-U", "0", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "@@ -1,0 +2 @@\n+world\n")

	r = runBin(t, bin, "diff", "--name-status", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, []string{"M\ta.txt", "D\tdel.txt", "R\td\te", "R\td/f.txt\te/f.txt", "A\tnew.txt"}, diffOutLines(r.stdout))

	r = runBin(t, bin, "diff", "--stat", f.dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, " a.txt          | 1 +\n del.txt        | 1 -\n {d => e}/f.txt | 0\n new.txt        | 1 +\n"+
		" 4 files changed, 2 insertions(+), 1 deletion(-)\n", r.stdout, "the moved file is listed, not the directory")

	checkDiffJSON(t, bin, f)

	r = runBin(t, bin, "diff", "--exit-code", f.mnt)
	assertFailure(t, r, exitChanges, "has 4 change(s)")
	assert.NotEmpty(t, r.stdout, "--exit-code still prints the patch")

	r = runBin(t, bin, "diff", "--stat", "--json", f.mnt)
	assertFailure(t, r, exitUsage, "exclude one another")

	require.NoError(t, os.WriteFile(filepath.Join(f.mnt, "bin.dat"), []byte("\x00\x01binary"), 0o644))
	r = runBin(t, bin, "diff", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "new file mode 100644\nindex 0000000..366fd40\nBinary files /dev/null and b/bin.dat differ\n")
	r = runBin(t, bin, "diff", "--binary", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "new file mode 100644\nindex 0000000000000000000000000000000000000000..")
	assert.Contains(t, r.stdout, "\nGIT binary patch\nliteral 8\n")
}

// checkDiffJSON checks that sbxfs diff --json parses and describes the
// changes of TestDiffMountedSandbox.
func checkDiffJSON(t *testing.T, bin string, f sandboxFixture) {
	t.Helper()
	r := runBin(t, bin, "diff", "--json", f.mnt)
	require.Equal(t, 0, r.code, r.stderr)
	var out diffJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	assert.Equal(t, f.orig, out.Original)
	byPath := map[string]int{}
	for i, c := range out.Changes {
		byPath[c.Path] = i
	}
	require.Len(t, out.Changes, 5)
	a := out.Changes[byPath["a.txt"]]
	assert.Equal(t, "modified", a.Kind)
	assert.Equal(t, 1, a.Added)
	assert.Equal(t, "d", out.Changes[byPath["e"]].From)
	moved := out.Changes[byPath["e/f.txt"]]
	assert.Equal(t, "d/f.txt", moved.From)
	assert.Equal(t, "e", moved.ImpliedBy, "moves with its directory")
	assert.Equal(t, "deleted", out.Changes[byPath["del.txt"]].Kind)
}

func diffOutLines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
