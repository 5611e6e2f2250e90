package commit

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// applyScript rebuilds b from a and the script, checking that the
// script's equal lines really are equal.
func applyScript(t *testing.T, a, b []string, script []diffLine) []string {
	t.Helper()
	var out []string
	i := 0
	for _, l := range script {
		switch l.op {
		case ' ':
			require.Equal(t, a[l.a], b[l.b])
			require.Equal(t, i, l.a)
			out = append(out, a[l.a])
			i++
		case '-':
			require.Equal(t, i, l.a)
			i++
		case '+':
			out = append(out, b[l.b])
		}
	}
	require.Equal(t, len(a), i, "every line of a is used")
	return out
}

// lcs is the length of a longest common subsequence, by dynamic
// programming: the reference for minimality.
func lcs(a, b []string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			if a[i] == b[j] {
				cur[j+1] = prev[j] + 1
			} else {
				cur[j+1] = max(prev[j+1], cur[j])
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func randomLines(r *rand.Rand, n, alphabet int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = string(rune('a'+r.IntN(alphabet))) + "\n"
	}
	return out
}

func TestDiffLinesRandom(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		a := randomLines(r, r.IntN(30), 1+r.IntN(5))
		b := randomLines(r, r.IntN(30), 1+r.IntN(5))
		script := diffLines(a, b)
		got := applyScript(t, a, b, script)
		require.Equal(t, strings.Join(b, ""), strings.Join(got, ""), "a=%q b=%q", a, b)
		added, deleted := countLines(script)
		common := lcs(a, b)
		require.Equal(t, len(a)+len(b)-2*common, added+deleted, "minimal for a=%q b=%q", a, b)
	}
}

func TestDiffLinesBudget(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	a, b := randomLines(r, 3000, 50), randomLines(r, 3000, 50)
	script := diffLines(a, b)
	got := applyScript(t, a, b, script)
	assert.Equal(t, strings.Join(b, ""), strings.Join(got, ""), "a large rewrite still gives a correct script")
}

func TestWriteHunks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		a, b    string
		context int
		want    string
	}{
		{"new file", "", "x\ny\n", 3, "@@ -0,0 +1,2 @@\n+x\n+y\n"},
		{"deleted file", "x\n", "", 3, "@@ -1 +0,0 @@\n-x\n"},
		{"no newline added", "x", "x\n", 3, "@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+x\n"},
		{"insert with no context", "a\nb\n", "a\nn\nb\n", 0, "@@ -1,0 +2 @@\n+n\n"},
		{"delete with no context", "a\nb\nc\n", "a\nc\n", 0, "@@ -2 +1,0 @@\n-b\n"},
		{"changes 2*context apart share a hunk", "1\n2\n3\n4\n", "x\n2\n3\ny\n", 1, "@@ -1,4 +1,4 @@\n-1\n+x\n 2\n 3\n-4\n+y\n"},
		{"changes further apart do not", "1\n2\n3\n4\n5\n", "x\n2\n3\n4\ny\n", 1, "@@ -1,2 +1,2 @@\n-1\n+x\n 2\n@@ -4,2 +4,2 @@\n 4\n-5\n+y\n"},
		{"far changes split", "1\n2\n3\n4\n5\n6\n", "x\n2\n3\n4\n5\ny\n", 1, "@@ -1,2 +1,2 @@\n-1\n+x\n 2\n@@ -5,2 +5,2 @@\n 5\n-6\n+y\n"},
		{"identical", "a\n", "a\n", 3, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, b := splitLines([]byte(tt.a)), splitLines([]byte(tt.b))
			var out bytes.Buffer
			require.NoError(t, writeHunks(&out, a, b, diffLines(a, b), tt.context))
			assert.Equal(t, tt.want, out.String())
		})
	}
}

func TestGitQuote(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"plain/path.txt", "plain/path.txt"},
		{"with space", "with space"},
		{"héllo", "héllo"},
		{"tab\there", `"tab\there"`},
		{"new\nline", `"new\nline"`},
		{`quo"te`, `"quo\"te"`},
		{`back\slash`, `"back\\slash"`},
		{"bad\xffbyte", `"bad\377byte"`},
		{"bell\a", `"bell\a"`},
		{"del\x7f", `"del\177"`},
		{"é\x01", "\"é\\001\""},
		{"real\uFFFDchar", "real\uFFFDchar"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, gitQuote(tt.in), "%q", tt.in)
	}
}

func TestRenameName(t *testing.T) {
	t.Parallel()
	tests := []struct{ a, b, want string }{
		{"a.txt", "b.txt", "a.txt => b.txt"},
		{"d/f.txt", "e/f.txt", "{d => e}/f.txt"},
		{"src/a/x.go", "src/b/x.go", "src/{a => b}/x.go"},
		{"dir/old.txt", "dir/new.txt", "dir/{old.txt => new.txt}"},
		{"a/b/c", "a/c", "a/{b => }/c"},
		{"tab\tx", "y", `"tab\tx" => y`},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, renameName(tt.a, tt.b), "%s -> %s", tt.a, tt.b)
	}
}

func TestStatLayout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		lines []statLine
		want  string
	}{
		{"one file", []statLine{{name: "a", added: 1}},
			" a | 1 +\n 1 file changed, 1 insertion(+)\n"},
		{"deletions only", []statLine{{name: "a", deleted: 2}, {name: "bb", deleted: 1}},
			" a  | 2 --\n bb | 1 -\n 2 files changed, 3 deletions(-)\n"},
		{"nothing counted", []statLine{{name: "a"}},
			" a | 0\n 1 file changed, 0 insertions(+), 0 deletions(-)\n"},
		{"scaled to 80 columns", []statLine{{name: "big", added: 300, deleted: 100}, {name: "small", added: 1}},
			" big   | 400 " + strings.Repeat("+", 49) + strings.Repeat("-", 17) + "\n small |   1 +\n 2 files changed, 301 insertions(+), 100 deletions(-)\n"},
		{"long name shortened", []statLine{{name: strings.Repeat("d/", 40) + "file.txt", added: 1}},
			" .../" + strings.Repeat("d/", 30) + "file.txt | 1 +\n 1 file changed, 1 insertion(+)\n"},
		// The expected lines of these cases are what git 2.39 prints.
		{"long name and scaled graph", []statLine{{name: "big", added: 300, deleted: 100},
			{name: strings.Repeat("d/", 40) + "file.txt", added: 1}, {name: "small", added: 1}},
			" big" + strings.Repeat(" ", 47) + " | 400 " + strings.Repeat("+", 15) + strings.Repeat("-", 6) + "\n" +
				" .../" + strings.Repeat("d/", 19) + "file.txt |   1 +\n" +
				" small" + strings.Repeat(" ", 45) + " |   1 +\n 3 files changed, 302 insertions(+), 100 deletions(-)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			writeStatLines(&b, tt.lines)
			assert.Equal(t, tt.want, b.String())
			for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
				assert.LessOrEqual(t, len(l), statWidth, l)
			}
		})
	}
}
