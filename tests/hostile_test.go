package tests

// Hostile input on real mounts: names no tool expects, a damaged or
// planted sandbox state, an original swapped for a symlink while a commit
// runs, other users. Every test checks that nothing outside the original
// (a sentinel directory) is ever written.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
	"github.com/sbxfs/sbxfs/manager"
)

// statusChange is one change of `sbxfs status --json` / `diff --json`,
// with its paths decoded to their real bytes.
type decodedChange struct {
	Path, Kind, From, Type, NewTarget string
}

func b64Or(s, b64 string, t testing.TB) string {
	t.Helper()
	if b64 == "" {
		if !utf8.ValidString(s) {
			t.Errorf("%q is not UTF-8 but comes without its _b64 form", s)
		}
		return s
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Errorf("bad base64 %q: %v", b64, err)
	}
	if utf8.Valid(b) {
		t.Errorf("%q is UTF-8 but comes base64-encoded", b)
	}
	return string(b)
}

// cliStatus runs `sbxfs status --json` and decodes the changes by path.
func cliStatus(t testing.TB, target string) map[string]decodedChange {
	t.Helper()
	r := sbxfsCLI(t, cliTimeout, "status", "--json", target)
	require.Equal(t, 0, r.code, "status --json: %s", r)
	var st struct {
		Changes []struct {
			Path    string `json:"path"`
			PathB64 string `json:"path_b64"`
			Kind    string `json:"kind"`
			From    string `json:"from"`
			FromB64 string `json:"from_b64"`
			Type    string `json:"type"`
		} `json:"changes"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), "status --json output: %s", r.stdout)
	out := map[string]decodedChange{}
	for _, c := range st.Changes {
		p := b64Or(c.Path, c.PathB64, t)
		out[p] = decodedChange{Path: p, Kind: c.Kind, From: b64Or(c.From, c.FromB64, t), Type: c.Type}
	}
	return out
}

// cliDiffJSON runs `sbxfs diff --json` and decodes the changes by path.
func cliDiffJSON(t testing.TB, target string) map[string]decodedChange {
	t.Helper()
	r := sbxfsCLI(t, cliTimeout, "diff", "--json", target)
	require.Equal(t, 0, r.code, "diff --json: %s", r)
	var d struct {
		Changes []struct {
			Path         string `json:"path"`
			PathB64      string `json:"path_b64"`
			Kind         string `json:"kind"`
			From         string `json:"from"`
			FromB64      string `json:"from_b64"`
			Type         string `json:"type"`
			NewTarget    string `json:"new_target"`
			NewTargetB64 string `json:"new_target_b64"`
		} `json:"changes"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &d), "diff --json output: %s", r.stdout)
	out := map[string]decodedChange{}
	for _, c := range d.Changes {
		p := b64Or(c.Path, c.PathB64, t)
		out[p] = decodedChange{Path: p, Kind: c.Kind, From: b64Or(c.From, c.FromB64, t), Type: c.Type,
			NewTarget: b64Or(c.NewTarget, c.NewTargetB64, t)}
	}
	return out
}

// deepPath returns a relative path of nested directories whose length
// takes an absolute path under any of roots up to just below PATH_MAX
// (4096 bytes with the NUL), leaving room for "/" + leaf.
func deepPath(roots []string, leaf string) string {
	longest := 0
	for _, r := range roots {
		longest = max(longest, len(r))
	}
	budget := 4095 - longest - 1 - len("/"+leaf) - 4
	var comps []string
	n := 0
	for i := 0; n < budget; i++ {
		l := min(200, budget-n-1)
		if l < 1 {
			break
		}
		c := fmt.Sprintf("%02d", i) + strings.Repeat("d", max(0, l-2))
		c = c[:l]
		comps = append(comps, c)
		n += len(c) + 1
	}
	return strings.Join(comps, "/")
}

// TestHostileNames: names with newlines, control characters, invalid
// UTF-8, 255 bytes, shell metacharacters, and a path of nearly PATH_MAX
// are created, read back, listed by status and diff (with path_b64 where
// JSON cannot hold them), and committed: the original then has exactly
// those names and contents.
func TestHostileNames(t *testing.T) {
	requireCLI(t)
	orig := newOrig(t, map[string]string{
		"plain.txt": "plain\n", "odd\nold": "old odd\n", "del\xffme": "delete me\n", "dir\x01orig/f": "f\n",
	})
	sb := mountSandbox(t, orig)
	files := map[string]string{
		"new\nline":                           "newline\n",
		"tab\tname":                           "tab\n",
		"bad-\xff\xfe-utf8":                   "not utf-8\n",
		"\x01ctl\x7f\x1b[31m":                 "control\n",
		"  spaces  ":                          "spaces\n",
		"-rf":                                 "dash\n",
		`back\slash "quote" 'single' $(x) *?`: "shell\n",
		"ünïcødé-名前":                          "unicode\n",
		strings.Repeat("L", 255):              "255 bytes\n",
		strings.Repeat("é", 127) + "x":        "255 bytes of UTF-8\n",
		`\x41\n%s%d`:                          "escapes\n",
		"dir\nwith\xffbad/inner\xfe":          "inner\n",
		"dir\nwith\xffbad/ok":                 "ok\n",
		"dir\x01orig/new\xc0\xaf":             "overlong\n",
		"dir\x01orig/\u202eright-to-left.txt": "rtl\n",
	}
	deep := deepPath([]string{sb.mnt, orig, sb.upper}, "leaf\xff.txt")
	files[deep+"/leaf\xff.txt"] = "deep\n"
	t.Logf("deep path: %d bytes in %d components", len(deep)+len("/leaf\xff.txt"), strings.Count(deep, "/")+2)
	for p, content := range files {
		require.NoError(t, os.MkdirAll(filepath.Dir(sb.path(p)), 0o755), "mkdir for %q", p)
		require.NoError(t, os.WriteFile(sb.path(p), []byte(content), 0o644), "create %q", p)
	}
	require.Len(t, strings.Repeat("é", 127)+"x", 255)
	_, err := os.Stat(sb.path(strings.Repeat("L", 256)))
	assert.ErrorIs(t, err, unix.ENAMETOOLONG, "a 256-byte name")
	require.NoError(t, os.Symlink("tgt\xff\nweird/../x", sb.path("link\n\xff")))
	require.NoError(t, os.Rename(sb.path("odd\nold"), sb.path("renamed\xfe\n")))
	require.NoError(t, os.Remove(sb.path("del\xffme")))

	for p, content := range files {
		b, err := os.ReadFile(sb.path(p))
		if assert.NoError(t, err, "read back %q", p) {
			assert.Equal(t, content, string(b), "content of %q", p)
		}
	}
	tgt, err := os.Readlink(sb.path("link\n\xff"))
	require.NoError(t, err)
	assert.Equal(t, "tgt\xff\nweird/../x", tgt)
	names := listDir(t, sb.mnt)
	for p := range files {
		if !strings.Contains(p, "/") {
			assert.Contains(t, names, p, "readdir lists %q", p)
		}
	}

	// What status and diff must list.
	want := map[string]decodedChange{
		"link\n\xff":    {Kind: "created", Type: "symlink"},
		"renamed\xfe\n": {Kind: "renamed", From: "odd\nold", Type: "file"},
		"del\xffme":     {Kind: "deleted", Type: "file"},
	}
	for p := range files {
		want[p] = decodedChange{Kind: "created", Type: "file"}
		for d := filepath.Dir(p); d != "." && d != "dir\x01orig"; d = filepath.Dir(d) {
			want[d] = decodedChange{Kind: "created", Type: "dir"}
		}
	}
	for p := range want {
		w := want[p]
		w.Path = p
		want[p] = w
	}
	got := cliStatus(t, sb.mnt)
	if !assert.Equal(t, want, got, "status --json") {
		for p := range got {
			if _, ok := want[p]; !ok {
				t.Errorf("status lists an unexpected %q", p)
			}
		}
	}
	gotDiff := cliDiffJSON(t, sb.mnt)
	assert.Equal(t, "tgt\xff\nweird/../x", gotDiff["link\n\xff"].NewTarget, "diff --json symlink target")
	for p, w := range want {
		d, ok := gotDiff[p]
		if assert.True(t, ok, "diff --json lists %q", p) {
			assert.Equal(t, w.Kind, d.Kind, "diff --json kind of %q", p)
			assert.Equal(t, w.From, d.From, "diff --json from of %q", p)
		}
	}
	assert.Len(t, gotDiff, len(want), "diff --json lists every change once")

	// The text forms keep one change per line.
	r := sbxfsCLI(t, cliTimeout, "status", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)
	assert.Len(t, strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n"), len(want)+1, "status: one line per change and the summary:\n%s", r.stdout)
	r = sbxfsCLI(t, cliTimeout, "diff", "--name-status", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)
	assert.Len(t, strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n"), len(want), "diff --name-status: one line per change:\n%s", r.stdout)
	r = sbxfsCLI(t, cliTimeout, "diff", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)
	r = sbxfsCLI(t, cliTimeout, "diff", "--stat", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)

	view := mustWalk(t, sb.mnt, viewOpts)
	r = sbxfsCLI(t, cliTimeout, "commit", "-m", "hostile names\n\xff", sb.mnt)
	require.Equal(t, 0, r.code, "commit: %s", r)
	assertSameTree(t, view, mustWalk(t, orig, viewOpts), "the original after the commit (want = the sandbox)")
}

// TestHostileSymlinkOverDirectory: a directory of the sandbox (new, or
// from the original) is removed and a symlink to a directory outside put
// in its place. The change set is the symlink, never what lies behind it;
// diff does not show the outside files; the commit installs the symlink
// and writes nothing through it.
func TestHostileSymlinkOverDirectory(t *testing.T) {
	requireCLI(t)
	sentinel := sentinelDir(t)
	orig := newOrig(t, map[string]string{"od/keep.txt": "orig keep\n", "od/sub/inner.txt": "orig inner\n", "a.txt": "a\n"})
	sb := mountSandbox(t, orig)
	// A new directory, with names the sentinel has too, replaced.
	require.NoError(t, os.MkdirAll(sb.path("nd/sub"), 0o755))
	require.NoError(t, os.WriteFile(sb.path("nd/keep.txt"), []byte("sandbox keep\n"), 0o644))
	require.NoError(t, os.WriteFile(sb.path("nd/sub/inner.txt"), []byte("sandbox inner\n"), 0o644))
	require.NoError(t, os.RemoveAll(sb.path("nd")))
	require.NoError(t, os.Symlink(sentinel, sb.path("nd")))
	// A directory of the original, changed, then replaced.
	require.NoError(t, os.WriteFile(sb.path("od/keep.txt"), []byte("sandbox keep\n"), 0o644))
	require.NoError(t, os.RemoveAll(sb.path("od")))
	require.NoError(t, os.Symlink(sentinel, sb.path("od")))

	got := cliStatus(t, sb.mnt)
	for p, c := range got {
		if strings.HasPrefix(p, "nd/") || strings.HasPrefix(p, "od/") {
			if c.Kind != "deleted" {
				t.Errorf("status lists %q as %s: it follows the symlink out of the sandbox", p, c.Kind)
			}
		}
	}
	assert.Equal(t, "symlink", got["nd"].Type, "nd is a new symlink")
	assert.Equal(t, "created", got["nd"].Kind)
	assert.Equal(t, "symlink", got["od"].Type, "od is a symlink now")
	r := sbxfsCLI(t, cliTimeout, "diff", sb.mnt)
	require.Equal(t, 0, r.code, "%s", r)
	for _, line := range []string{"\n+sentinel", "\n+inner", "\n+x\n"} {
		assert.NotContains(t, r.stdout, line, "diff shows a file outside the sandbox through the symlink")
	}

	view := mustWalk(t, sb.mnt, walkOpts{})
	r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	require.Equal(t, 0, r.code, "commit: %s", r)
	for _, p := range []string{"nd", "od"} {
		tgt, err := os.Readlink(filepath.Join(orig, p))
		if assert.NoError(t, err, "%s is a symlink in the original", p) {
			assert.Equal(t, sentinel, tgt)
		}
	}
	// The walk of the mount followed nothing: compare without following.
	assertSameTree(t, view, mustWalk(t, orig, walkOpts{}), "the original after the commit")
}

// damaged is an unmounted sandbox with changes, and a sentinel directory
// nothing may write to.
type damaged struct {
	sb       *sandbox
	orig     string
	sentinel string
	before   map[string]nodeInfo // the original
	view     map[string]nodeInfo // the sandbox's view
}

func newDamaged(t *testing.T) *damaged {
	t.Helper()
	d := &damaged{sentinel: sentinelDir(t)}
	d.orig = newOrig(t, map[string]string{"a.txt": "a\n", "b.txt": "b\n", "dir/c.txt": "c\n"})
	d.sb = mountSandbox(t, d.orig, allowServerErrors())
	m := d.sb.path
	require.NoError(t, appendFile(m("a.txt"), []byte("sandbox\n")))
	require.NoError(t, os.WriteFile(m("new.txt"), []byte("new\n"), 0o644))
	require.NoError(t, os.Mkdir(m("newdir"), 0o755))
	require.NoError(t, os.WriteFile(m("newdir/f"), []byte("f\n"), 0o644))
	require.NoError(t, os.Remove(m("b.txt")))
	require.NoError(t, os.WriteFile(m("last.txt"), []byte("last\n"), 0o644))
	d.view = mustWalk(t, d.sb.mnt, viewOpts)
	require.NoError(t, d.sb.stop())
	d.before = mustWalk(t, d.orig, unchangedOpts)
	return d
}

func (d *damaged) journal() string { return filepath.Join(d.sb.work, "journal") }

// run runs a command on the sandbox directory: it must succeed or fail
// with a documented code and one clear message, never a Go trace.
func (d *damaged) run(t *testing.T, args ...string) cliRun {
	t.Helper()
	r := sbxfsCLI(t, cliTimeout, append(args, d.sb.state)...)
	t.Logf("%s", r)
	if r.code != 0 {
		assert.True(t, strings.HasPrefix(r.stderr, "sbxfs: "), "one sbxfs message: %s", r)
		assert.NotContains(t, r.stderr, "goroutine ")
		assert.NotContains(t, r.stderr, "panic")
		assert.Contains(t, []int{1, 2, 3, 4, 6, 7, 8}, r.code, "a documented exit code")
	}
	return r
}

// checkOriginal checks the original: unchanged, or (after a commit that
// succeeded) every path as before or as in the sandbox, and nothing else.
func (d *damaged) checkOriginal(t *testing.T, committed bool) {
	t.Helper()
	if !committed {
		assertSameTree(t, d.before, mustWalk(t, d.orig, unchangedOpts), "the original (no commit succeeded)")
		return
	}
	now := mustWalk(t, d.orig, viewOpts)
	for p, n := range now {
		if p == "" {
			continue
		}
		v, inView := d.view[p]
		if !inView {
			t.Errorf("after the commit the original has %q, which the sandbox does not have", p)
			continue
		}
		if len(diffTrees(map[string]nodeInfo{p: v}, map[string]nodeInfo{p: n}, 1)) > 0 {
			if _, wasThere := d.before[p]; !wasThere {
				t.Errorf("after the commit %q is neither the original's nor the sandbox's", p)
			}
		}
	}
}

// TestHostileDamagedState damages the journal, the sandbox record and the
// undo log of an unmounted sandbox, or plants symlinks in its state, and
// runs the commands on it: each gives a clear error or repairs safely,
// nothing outside the original is ever written, and the sandbox's changes
// are never committed in part without a word.
func TestHostileDamagedState(t *testing.T) {
	requireCLI(t)

	t.Run("journal torn tail", func(t *testing.T) {
		d := newDamaged(t)
		st, err := os.Stat(d.journal())
		require.NoError(t, err)
		require.NoError(t, os.Truncate(d.journal(), st.Size()-5))
		d.run(t, "status")
		d.run(t, "diff")
		r := d.run(t, "commit")
		d.checkOriginal(t, r.code == 0)
	})

	t.Run("journal byte flipped", func(t *testing.T) {
		d := newDamaged(t)
		b, err := os.ReadFile(d.journal())
		require.NoError(t, err)
		recs, valid, err := layers.DecodeJournal(b)
		require.NoError(t, err)
		require.Equal(t, len(b), valid)
		require.Greater(t, len(recs), 4)
		b[16+8+30] ^= 0x40 // inside the first record's payload
		require.NoError(t, os.WriteFile(d.journal(), b, 0o600))
		r := d.run(t, "status")
		if r.code == 0 {
			assert.NotContains(t, r.stdout, "no changes", "status of a sandbox with changes says it has none")
		}
		r = d.run(t, "commit")
		d.checkOriginal(t, r.code == 0)
		if r.code == 0 {
			assertSameTree(t, d.view, mustWalk(t, d.orig, viewOpts),
				"the commit succeeded without a word, but the original lacks sandbox changes recorded past the damaged journal record (they were discarded with the sandbox)")
		}
	})

	t.Run("journal garbage", func(t *testing.T) {
		d := newDamaged(t)
		require.NoError(t, os.WriteFile(d.journal(), []byte("this is not a journal at all\n"), 0o600))
		for _, cmd := range []string{"status", "diff"} {
			r := d.run(t, cmd)
			assert.NotEqual(t, 0, r.code, "%s of a sandbox whose journal is garbage", cmd)
		}
		r := d.run(t, "commit")
		assert.NotEqual(t, 0, r.code, "commit of a sandbox whose journal is garbage")
		d.checkOriginal(t, false)
		r = d.run(t, "rollback")
		assert.Equal(t, 0, r.code, "rollback discards a sandbox whatever its journal holds")
		d.checkOriginal(t, false)
	})

	t.Run("journal records escaping the sandbox", func(t *testing.T) {
		d := newDamaged(t)
		relSentinel, err := filepath.Rel(d.sb.upper, d.sentinel)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(relSentinel, "../"))
		j, err := layers.OpenJournal(d.journal())
		require.NoError(t, err)
		for _, r := range []layers.Record{
			{Op: layers.OpCreate, Path: relSentinel + "/keep.txt"},
			{Op: layers.OpUnlink, Path: relSentinel + "/sub/inner.txt"},
			{Op: layers.OpMkdir, Path: relSentinel + "/made"},
			{Op: layers.OpCreate, Path: d.sentinel + "/abs.txt"},
			{Op: layers.OpUnlink, Path: d.sentinel + "/sub/deep/x"},
			{Op: layers.OpRename, Path: "a.txt", Path2: relSentinel + "/moved"},
			{Op: layers.OpSetattr, Path: "../" + filepath.Base(d.sb.state) + "/work/sandbox.json"},
			{Op: layers.OpBase, Path: relSentinel, Path2: "v1 1 16877 0 0 0"},
		} {
			require.NoError(t, j.Append(r))
		}
		require.NoError(t, j.Close())
		for _, cmd := range []string{"status", "diff"} {
			r := d.run(t, cmd)
			assert.NotContains(t, r.stdout, "sentinel", "%s lists a path outside the sandbox as one of its changes (journal records with \"..\" or absolute paths are taken as they are)", cmd)
		}
		r := d.run(t, "commit")
		d.checkOriginal(t, r.code == 0)
		if r.code != 0 {
			r = d.run(t, "commit", "--force")
			d.checkOriginal(t, r.code == 0)
		}
		if r.code != 0 {
			r = d.run(t, "rollback")
			assert.Equal(t, 0, r.code, "rollback")
			d.checkOriginal(t, false)
		}
	})

	t.Run("sandbox record damaged", func(t *testing.T) {
		type variant func(d *damaged, good []byte, m map[string]any) []byte
		edit := func(f func(d *damaged, c map[string]any)) variant {
			return func(d *damaged, _ []byte, m map[string]any) []byte {
				f(d, m)
				b, err := json.Marshal(m)
				require.NoError(t, err)
				return b
			}
		}
		cases := []struct {
			name string
			data variant
		}{
			{"truncated", func(_ *damaged, good []byte, _ map[string]any) []byte { return good[:len(good)/2] }},
			{"empty", func(*damaged, []byte, map[string]any) []byte { return nil }},
			{"flipped", func(_ *damaged, good []byte, _ map[string]any) []byte {
				return append([]byte{good[0] ^ 0x20}, good[1:]...)
			}},
			{"newer version", edit(func(_ *damaged, c map[string]any) { c["version"] = 99 })},
			{"no lowers", edit(func(_ *damaged, c map[string]any) { c["lowers"] = []string{} })},
			{"relative original", edit(func(d *damaged, c map[string]any) {
				rel, err := filepath.Rel(d.sb.state, d.orig)
				require.NoError(t, err)
				c["lowers"] = []string{rel}
			})},
			{"original with ..", edit(func(d *damaged, c map[string]any) {
				c["lowers"] = []string{d.sb.state + "/../" + filepath.Base(filepath.Dir(d.orig)) + "/orig"}
			})},
			{"relative upper", edit(func(_ *damaged, c map[string]any) { c["upper"] = "upper" })},
			{"upper with ..", edit(func(d *damaged, c map[string]any) { c["upper"] = d.sb.upper + "/../upper" })},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				d := newDamaged(t)
				rec := filepath.Join(d.sb.work, layers.MetaFile)
				good, err := os.ReadFile(rec)
				require.NoError(t, err)
				var m map[string]any
				require.NoError(t, json.Unmarshal(good, &m))
				require.NoError(t, os.WriteFile(rec, tc.data(d, good, m), 0o600))
				for _, cmd := range [][]string{{"status"}, {"diff"}, {"commit"}, {"rollback", "--keep"}, {"rollback"}} {
					r := d.run(t, cmd...)
					assert.NotEqual(t, 0, r.code, "%s with a damaged sandbox record (%s)", cmd[0], tc.name)
				}
				d.checkOriginal(t, false)
				assert.DirExists(t, d.sb.upper, "the upper is kept")
				assert.FileExists(t, d.journal(), "the journal is kept")
				// Put back, everything works again.
				require.NoError(t, os.WriteFile(rec, good, 0o600))
				r := d.run(t, "commit")
				require.Equal(t, 0, r.code, "commit with the record repaired")
				assertSameTree(t, d.view, mustWalk(t, d.orig, viewOpts), "the original after the commit")
			})
		}
	})

	t.Run("undo log damaged", func(t *testing.T) {
		type undoFn func(d *damaged, txnIn string) []byte
		log := func(state string, txn func(d *damaged, txnIn string) string, steps ...map[string]any) undoFn {
			return func(d *damaged, txnIn string) []byte {
				for _, s := range steps {
					if p, ok := s["path"].(string); ok && strings.HasPrefix(p, "SENTINEL") {
						s["path"] = d.sentinel + p[len("SENTINEL"):]
					}
				}
				b, err := json.Marshal(map[string]any{"version": 1, "id": "0123456789abcdef", "state": state,
					"original": d.orig, "txn": txn(d, txnIn), "steps": steps})
				require.NoError(t, err)
				return b
			}
		}
		in := func(_ *damaged, txnIn string) string { return txnIn }
		outside := func(d *damaged, _ string) string { return d.sentinel }
		outsideParent := func(d *damaged, _ string) string { return filepath.Dir(d.sentinel) }
		valid := log("prepared", in, map[string]any{"kind": "detach", "path": "a.txt", "slot": "b/1"})
		cases := []struct {
			name string
			data undoFn
			txn  bool // make the transaction directory inside the work dir
		}{
			{"truncated", func(d *damaged, txnIn string) []byte { b := valid(d, txnIn); return b[:len(b)/2] }, true},
			{"garbage", func(*damaged, string) []byte { return []byte("\x00\xffnot json") }, false},
			{"step path with ..", log("prepared", in, map[string]any{"kind": "detach", "path": "../x", "slot": "b/1"}), true},
			{"absolute step path", log("prepared", in, map[string]any{"kind": "install", "path": "SENTINEL/keep.txt", "slot": "s/1"}), true},
			{"slot with ..", log("prepared", in, map[string]any{"kind": "detach", "path": "a.txt", "slot": "../../x"}), true},
			{"another original", func(d *damaged, txnIn string) []byte {
				b, _ := json.Marshal(map[string]any{"version": 1, "id": "x", "state": "prepared", "original": d.sentinel, "txn": txnIn, "steps": []any{}})
				return b
			}, true},
			{"committed, transaction outside", log("committed", outside), false},
			{"prepared, transaction outside", log("prepared", outside, map[string]any{"kind": "detach", "path": "stolen", "slot": "keep.txt"}), false},
			{"prepared, transaction outside, install", log("prepared", outsideParent, map[string]any{"kind": "install", "path": "stolen", "slot": "sentinel"}), false},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				d := newDamaged(t)
				undo := filepath.Join(d.sb.work, "commit.json")
				txnIn := filepath.Join(d.sb.work, "txn-0123456789abcdef")
				require.NoError(t, os.WriteFile(undo, tc.data(d, txnIn), 0o600))
				if tc.txn {
					for _, sub := range []string{"b", "s", "m"} {
						require.NoError(t, os.MkdirAll(filepath.Join(txnIn, sub), 0o700))
					}
				}
				d.run(t, "recover")
				r := d.run(t, "commit")
				d.checkOriginal(t, r.code == 0)
			})
		}
	})

	t.Run("symlinks planted in the state", func(t *testing.T) {
		for _, name := range []string{"work/server.pid", "work/server.log", "work/journal", "work/journal.compact", "work/commit.lock", "work/commit.json", "work/txn-0123456789abcdef", "work/rebase.json", "work/last-commit.json", "upper", "work"} {
			t.Run(name, func(t *testing.T) {
				d := newDamaged(t)
				target := filepath.Join(d.sentinel, "keep.txt")
				if name == "upper" || name == "work" || strings.Contains(name, "txn-") {
					target = filepath.Join(d.sentinel, "sub")
				}
				p := filepath.Join(d.sb.state, name)
				if name == "upper" || name == "work" {
					require.NoError(t, os.Rename(p, p+".real"))
				} else {
					_ = os.Remove(p)
				}
				require.NoError(t, os.Symlink(target, p))

				// Mount it in the background as a user would, use it.
				mnt := filepath.Join(t.TempDir(), "mnt")
				require.NoError(t, os.Mkdir(mnt, 0o755))
				registerMount(mnt)
				t.Cleanup(func() {
					if _, ok := mountAt(mnt); ok {
						_ = sbxfsCLI(t, cliTimeout, "unmount", mnt)
					}
					if _, ok := mountAt(mnt); ok {
						_, _ = runTimeout(10*time.Second, "umount", "-l", mnt)
					}
				})
				r := sbxfsCLI(t, cliTimeout, "mount", "--upper", d.sb.state, d.orig, mnt)
				t.Logf("%s", r)
				if r.code == 0 {
					_ = os.WriteFile(filepath.Join(mnt, "while-planted"), []byte("x\n"), 0o644)
					_, _ = os.ReadFile(filepath.Join(mnt, "a.txt"))
					d.view = mustWalk(t, mnt, viewOpts)
					r = sbxfsCLI(t, cliTimeout, "unmount", mnt)
					assert.Equal(t, 0, r.code, "unmount: %s", r)
				} else {
					assertCleanCLIError(t, r, r.code)
				}
				d.run(t, "status")
				c := d.run(t, "commit")
				if c.code != 0 {
					d.checkOriginal(t, false)
					d.run(t, "rollback")
				}
				d.checkOriginal(t, c.code == 0)
			})
		}
	})
}

// TestHostileStagingNamesInOriginal: an original that holds entries named
// like sbxfs's own staging directories (.sbxfs-txn-*) keeps them through
// a rollback and a commit: they are the user's data.
func TestHostileStagingNamesInOriginal(t *testing.T) {
	requireCLI(t)
	orig := newOrig(t, map[string]string{".sbxfs-txn-mine/notes.txt": "mine\n", ".sbxfs-txn-file": "file\n", "a.txt": "a\n"})
	for _, cmd := range []string{"rollback", "commit"} {
		sb := mountSandbox(t, orig)
		require.NoError(t, os.WriteFile(sb.path("a.txt"), []byte("changed by "+cmd+"\n"), 0o644))
		r := sbxfsCLI(t, cliTimeout, cmd, sb.mnt)
		require.Equal(t, 0, r.code, "%s", r)
		assert.FileExists(t, filepath.Join(orig, ".sbxfs-txn-file"), "after %s", cmd)
		assert.FileExists(t, filepath.Join(orig, ".sbxfs-txn-mine/notes.txt"), "after %s", cmd)
	}
	assert.Equal(t, "changed by commit\n", mustRead(t, filepath.Join(orig, "a.txt")))
}

// TestHostileSymlinkSwapUnderTheMount: after the mount looked up d,
// another process swaps the original's d for a symlink to a directory
// outside that only root may read. Through the mount (served by root),
// nothing of that directory may show: not its names, contents, link
// targets or attributes, not a copy-up of it (before 2026-11-27 the
// server read lower objects by path and followed the symlink: `cat
// MNT/d/x` printed root's file).
func TestHostileSymlinkSwapUnderTheMount(t *testing.T) {
	requireCLI(t)
	orig := newOrig(t, map[string]string{"d/pub": "public\n", "d/ln": "-> pub", "d/sub/f": "f\n"})
	secret := filepath.Join(t.TempDir(), "secret")
	writeTree(t, secret, map[string]string{"pub": "SECRET\n", "x": "SECRET\n", "ln": "-> SECRET", "sub/f": "SECRET\n", "sub/y": "SECRET\n"})
	require.NoError(t, os.Chmod(secret, 0o700))
	require.NoError(t, unix.Setxattr(filepath.Join(secret, "pub"), "user.secret", []byte("SECRET"), 0))
	originalGuard(t, secret)
	sb := mountSandbox(t, orig)
	assert.Equal(t, []string{"ln", "pub", "sub"}, listDir(t, sb.path("d")))
	assert.Equal(t, "public\n", mustRead(t, sb.path("d/pub")))
	assert.Equal(t, []string{"f"}, listDir(t, sb.path("d/sub")))

	d := filepath.Join(orig, "d")
	require.NoError(t, os.Rename(d, d+".away"))
	require.NoError(t, os.Symlink(secret, d))
	t.Cleanup(func() {
		_ = os.Remove(d)
		_ = os.Rename(d+".away", d)
	})
	for _, p := range []string{"d/x", "d/pub", "d/sub/f", "d/sub/y"} {
		if b, err := os.ReadFile(sb.path(p)); err == nil {
			assert.NotContains(t, string(b), "SECRET", "read %s", p)
		}
	}
	if target, err := os.Readlink(sb.path("d/ln")); err == nil {
		assert.NotEqual(t, "SECRET", target)
	}
	if ents, err := os.ReadDir(sb.path("d")); err == nil {
		for _, e := range ents {
			assert.NotEqual(t, "x", e.Name(), "the outside directory's names listed")
		}
	}
	if ents, err := os.ReadDir(sb.path("d/sub")); err == nil {
		for _, e := range ents {
			assert.NotEqual(t, "y", e.Name(), "the outside directory's names listed")
		}
	}
	buf := make([]byte, 64)
	if n, err := unix.Lgetxattr(sb.path("d/pub"), "user.secret", buf); err == nil {
		assert.NotEqual(t, "SECRET", string(buf[:n]))
	}
	// A write to d/pub copies up the original's d/pub, or fails: never
	// the outside file.
	if err := appendFile(sb.path("d/pub"), []byte("+")); err == nil {
		assert.NotContains(t, mustRead(t, sb.path("d/pub")), "SECRET")
	}
	if b, err := os.ReadFile(filepath.Join(sb.upper, "d/pub")); err == nil {
		assert.NotContains(t, string(b), "SECRET", "the upper's copy")
	}
}

// TestHostileRenameRaceUnderTheMount: one thread keeps making and
// removing x in a directory it holds open in the mount, while another
// keeps renaming that directory away, putting at its old name a symlink
// to a directory outside, and back. The server computes an object's
// upper path from the names the kernel gave; a path computed before the
// rename and used after the symlink went through the symlink: a server
// run as root made x outside (before 2026-11-27). Renames of directories
// and rmdir now wait for the operations using paths, and those for them.
func TestHostileRenameRaceUnderTheMount(t *testing.T) {
	requireCLI(t)
	orig := newOrig(t, map[string]string{"keep": "k"})
	outside := sentinelDir(t)
	sb := mountSandbox(t, orig)
	require.NoError(t, os.Mkdir(sb.path("a"), 0o755))
	dfd, err := unix.Open(sb.path("a"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	require.NoError(t, err)
	defer unix.Close(dfd)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var made, swapped atomic.Int64
	errs := map[string]int{}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			fd, err := unix.Openat(dfd, "x", unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC, 0o644)
			if err != nil {
				errs[err.Error()]++
				_ = unix.Unlinkat(dfd, "x", unix.AT_REMOVEDIR) // a directory left by a removal that failed
				continue
			}
			_, _ = unix.Write(fd, []byte("written through the mount\n"))
			unix.Close(fd)
			_ = unix.Unlinkat(dfd, "x", 0)
			_ = unix.Mkdirat(dfd, "x", 0o755)
			_ = unix.Unlinkat(dfd, "x", unix.AT_REMOVEDIR)
			made.Add(1)
		}
	}()
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if os.Rename(sb.path("a"), sb.path("b")) != nil {
				continue
			}
			if os.Symlink(outside, sb.path("a")) == nil {
				swapped.Add(1)
				_ = os.Remove(sb.path("a"))
			}
			_ = os.Rename(sb.path("b"), sb.path("a"))
		}
	}()
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	t.Logf("%d files made and removed, %d swaps; errors %v", made.Load(), swapped.Load(), errs)
	for _, n := range []string{"x"} {
		assert.NoFileExists(t, filepath.Join(outside, n), "made outside through the mount")
		assert.NoDirExists(t, filepath.Join(outside, n), "made outside through the mount")
	}
	assert.Empty(t, errs, "making x in a directory held open fails only by a stale path")
	require.Greater(t, swapped.Load(), int64(100), "the race ran")
}

// TestHostileSymlinkSwapDuringCommit: while `sbxfs commit` runs, another
// process keeps exchanging a directory of the original with a symlink to
// a directory outside. Nothing outside changes; the commit succeeds or
// fails cleanly, and once the swapping stops the sandbox commits.
func TestHostileSymlinkSwapDuringCommit(t *testing.T) {
	requireCLI(t)
	t.Run("in place", func(t *testing.T) { symlinkSwapRounds(t, false) })
	// The sandbox also renamed the swapped directory and one beneath
	// it: the change set reads the original through those renames.
	t.Run("renamed", func(t *testing.T) { symlinkSwapRounds(t, true) })
}

func symlinkSwapRounds(t *testing.T, rename bool) {
	const rounds = 8
	var failures atomic.Int32
	for round := range rounds {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			sentinel := sentinelDir(t)
			files := map[string]string{"e/x": "x\n"}
			for i := range 60 {
				files[fmt.Sprintf("d/f%03d", i)] = fmt.Sprintf("original %d\n", i)
				files[fmt.Sprintf("d/sub/g%03d", i)] = fmt.Sprintf("original sub %d\n", i)
			}
			orig := newOrig(t, files)
			sb := mountSandbox(t, orig, allowServerErrors())
			for i := range 60 {
				require.NoError(t, os.WriteFile(sb.path(fmt.Sprintf("d/f%03d", i)), []byte("changed\n"), 0o644))
				require.NoError(t, os.WriteFile(sb.path(fmt.Sprintf("d/sub/n%03d", i)), []byte("new\n"), 0o644))
				if i%5 == 0 {
					require.NoError(t, os.Remove(sb.path(fmt.Sprintf("d/sub/g%03d", i))))
				}
			}
			require.NoError(t, os.Chmod(sb.path("d/sub"), 0o700))
			if rename {
				require.NoError(t, os.Rename(sb.path("d/sub"), sb.path("d/moved")))
				require.NoError(t, os.Rename(sb.path("d"), sb.path("renamed")))
			}
			view := mustWalk(t, sb.mnt, viewOpts)
			before := mustWalk(t, orig, unchangedOpts)

			d, swap := filepath.Join(orig, "d"), filepath.Join(orig, "d.swap")
			require.NoError(t, os.Symlink(sentinel, swap))
			var stop atomic.Bool
			var wg sync.WaitGroup
			var swaps atomic.Int64
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Swapped for short moments at random times, so that some
				// commits pass their conflict check and meet the symlink
				// while applying, or while undoing.
				rng := rand.New(rand.NewPCG(uint64(round), 1))
				for !stop.Load() {
					time.Sleep(time.Duration(rng.IntN(int(round+1)*3000)) * time.Microsecond)
					if unix.Renameat2(unix.AT_FDCWD, d, unix.AT_FDCWD, swap, unix.RENAME_EXCHANGE) != nil {
						continue
					}
					swaps.Add(1)
					time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
					for unix.Renameat2(unix.AT_FDCWD, d, unix.AT_FDCWD, swap, unix.RENAME_EXCHANGE) != nil && !stop.Load() {
					}
				}
			}()
			r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
			stop.Store(true)
			wg.Wait()
			// (After a commit that moved d, there is no d: the last
			// exchanges failed.)
			var st unix.Stat_t
			if unix.Lstat(d, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				require.NoError(t, unix.Renameat2(unix.AT_FDCWD, d, unix.AT_FDCWD, swap, unix.RENAME_EXCHANGE))
			}
			t.Logf("%d swaps during the commit; %s", swaps.Load(), r)
			if err := os.Remove(swap); err != nil {
				out, _ := runTimeout(10*time.Second, "find", orig, sb.work, "-maxdepth", "3", "-printf", "%y %i %p -> %l\n")
				undo, _ := os.ReadFile(filepath.Join(sb.work, "commit.json"))
				t.Fatalf("d.swap must be the symlink again: %v\nundo log: %s\nfiles:\n%s", err, undo, out)
			}
			if r.code == 0 {
				if !assertSameTree(t, view, mustWalk(t, orig, viewOpts), "the original after a commit that succeeded") {
					// Seen twice on 2026-11-27 (io_uring, "renamed"): a
					// commit that succeeded under 3 swaps left
					// renamed/moved with the new files only. Say where
					// the original's d/sub went.
					out, _ := runTimeout(10*time.Second, "find", filepath.Dir(orig), sb.state, "-maxdepth", "4", "-printf", "%y %i %p -> %l\n")
					t.Logf("the original's parent and the sandbox directory:\n%s", out)
				}
				return
			}
			failures.Add(1)
			assertCleanCLIError(t, r, r.code)
			assert.Contains(t, []int{exitConflictCode, exitCommitFailedCode}, r.code)
			// A commit that failed undid its part, or left it for
			// recovery: the next command recovers, then commits.
			r = sbxfsCLI(t, cliTimeout, "recover", sb.mnt)
			if r.code != 0 {
				undo, _ := os.ReadFile(filepath.Join(sb.work, "commit.json"))
				out, _ := runTimeout(10*time.Second, "find", orig, sb.work, "-printf", "%y %i %p\n")
				t.Fatalf("recover after the swapping stopped: %s\nundo log: %s\nfiles:\n%s", r, undo, out)
			}
			assertSameTree(t, before, mustWalk(t, orig, unchangedOpts), "the original after the failed commit and recovery")
			r = sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
			// (Each exchange changed the ctime of the directory the
			// sandbox moved, not its mode, owner or attributes: no
			// conflict.)
			require.Equal(t, 0, r.code, "commit once the swapping stopped: %s", r)
			assertSameTree(t, view, mustWalk(t, orig, viewOpts), "the original after the retried commit")
		})
	}
	t.Logf("%d of %d commits failed under the swapping", failures.Load(), rounds)
}

// TestHostileOtherUser: the user nobody can neither read a sandbox's
// state nor reach its mount or its sockets: the state root is 0700, the
// files in it 0600, the sockets 0600. (That a setuid program in the
// mount does not run setuid is TestNosuidNodev.)
func TestHostileOtherUser(t *testing.T) {
	requireCLI(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as nobody")
	}
	orig := newOrig(t, map[string]string{"a.txt": "a\n"})
	openParents(t, orig)
	base := t.TempDir()
	root := filepath.Join(base, "state")
	openParents(t, root)
	mnt := filepath.Join(base, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	registerMount(mnt)
	t.Cleanup(func() {
		if _, ok := mountAt(mnt); ok {
			if r := sbxfsCLI(t, cliTimeout, "unmount", mnt); r.code != 0 {
				t.Errorf("unmount: %s", r)
				_, _ = runTimeout(10*time.Second, "umount", "-l", mnt)
			}
		}
	})
	r := sbxfsCLI(t, cliTimeout, "--state-dir", root, "mount", orig, mnt)
	require.Equal(t, 0, r.code, "mount: %s", r)
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "secret.txt"), []byte("secret\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "a.txt"), []byte("secret a\n"), 0o644))
	dirs, err := filepath.Glob(filepath.Join(root, "mounts", "*"))
	require.NoError(t, err)
	require.Len(t, dirs, 1, "one sandbox under the state root")
	dir := dirs[0]

	// Modes.
	// (The upper's own mode is the mode of the mount's root, as in kernel
	// overlayfs: the 0700 directory above it keeps others out.)
	for _, p := range []string{root, filepath.Join(root, "mounts"), dir, filepath.Join(dir, "work")} {
		assert.Equal(t, uint32(0o700), lstat(t, p).Mode&0o7777, "mode of %s", p)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "work"))
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		st := lstat(t, filepath.Join(dir, "work", e.Name()))
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			assert.Equal(t, uint32(0o700), st.Mode&0o7777, "mode of work/%s", e.Name())
		} else {
			assert.Equal(t, uint32(0o600), st.Mode&0o7777, "mode of work/%s", e.Name())
		}
	}
	t.Logf("work directory: %s", strings.Join(names, " "))
	assert.Contains(t, names, manager.ControlSocket)

	// Nobody can read any of it, nor reach the mount.
	deny := func(what string, name string, args ...string) {
		t.Helper()
		out, err := nobodyCmd(t, name, args...).CombinedOutput()
		if err == nil {
			t.Errorf("nobody could %s: %s %q: %s", what, name, args, out)
		} else {
			assert.Contains(t, string(out), "ermission denied", "nobody %s: %s %q", what, name, args)
		}
	}
	deny("list the state root", "ls", root)
	deny("read the upper", "cat", filepath.Join(dir, "upper", "secret.txt"))
	deny("read the journal", "cat", filepath.Join(dir, "work", "journal"))
	deny("read the sandbox record", "cat", filepath.Join(dir, "work", layers.MetaFile))
	deny("list the mount", "ls", mnt)
	deny("read through the mount", "cat", filepath.Join(mnt, "secret.txt"))
	connect := `use IO::Socket::UNIX; IO::Socket::UNIX->new(Peer => $ARGV[0]) or do { print "$!\n"; exit 3 }; exit 0`
	deny("connect to the control socket", "perl", "-e", connect, filepath.Join(dir, "work", manager.ControlSocket))
	// Even with the directories open, the socket's own mode refuses.
	require.NoError(t, os.Chmod(root, 0o711))
	for _, p := range []string{filepath.Join(root, "mounts"), dir, filepath.Join(dir, "work")} {
		require.NoError(t, os.Chmod(p, 0o711))
	}
	deny("connect to the control socket (directories opened)", "perl", "-e", connect, filepath.Join(dir, "work", manager.ControlSocket))
	deny("read the journal (directories opened)", "cat", filepath.Join(dir, "work", "journal"))
	out, err := nobodyCmd(t, cliBin, "status", mnt).CombinedOutput()
	assert.Error(t, err, "nobody ran sbxfs status on root's sandbox: %s", out)
	out, err = nobodyCmd(t, cliBin, "commit", dir).CombinedOutput()
	assert.Error(t, err, "nobody ran sbxfs commit on root's sandbox: %s", out)
	assert.Equal(t, "a\n", mustRead(t, filepath.Join(orig, "a.txt")))
	for _, p := range []string{root, filepath.Join(root, "mounts"), dir, filepath.Join(dir, "work")} {
		require.NoError(t, os.Chmod(p, 0o700))
	}

	// The daemon's socket.
	root2 := filepath.Join(base, "state2")
	openParents(t, root2)
	t.Cleanup(func() { stopDaemonOf(t, root2) })
	r = sbxfsCLI(t, cliTimeout, "--state-dir", root2, "create", orig)
	require.Equal(t, 0, r.code, "create: %s", r)
	id, mnt2, _ := strings.Cut(strings.TrimSpace(r.stdout), "\t")
	registerMount(mnt2)
	t.Cleanup(func() {
		if r := sbxfsCLI(t, cliTimeout, "--state-dir", root2, "destroy", id); r.code != 0 {
			t.Errorf("destroy: %s", r)
		}
	})
	sock := filepath.Join(root2, manager.DaemonSocket)
	assert.Equal(t, uint32(0o700), lstat(t, root2).Mode&0o7777, "mode of the state root")
	assert.Equal(t, uint32(0o600), lstat(t, sock).Mode&0o7777, "mode of the daemon socket")
	deny("connect to the daemon socket", "perl", "-e", connect, sock)
	require.NoError(t, os.Chmod(root2, 0o711))
	deny("connect to the daemon socket (state root opened)", "perl", "-e", connect, sock)
	out, err = nobodyCmd(t, cliBin, "--state-dir", root2, "list").CombinedOutput()
	assert.Error(t, err, "nobody listed root's sandboxes: %s", out)
	require.NoError(t, os.Chmod(root2, 0o700))
}

// stopDaemonOf stops the daemon of a state root (SIGTERM) and waits for
// it to exit.
func stopDaemonOf(t testing.TB, root string) {
	d, err := manager.DialDaemon(root)
	if err != nil {
		return
	}
	pid := d.Pid
	d.Close()
	_ = unix.Kill(pid, unix.SIGTERM)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if unix.Kill(pid, 0) != nil {
			return
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(b), ") Z ") {
			return
		}
	}
	t.Errorf("the daemon of %s (pid %d) did not exit", root, pid)
	_ = unix.Kill(pid, unix.SIGKILL)
}
