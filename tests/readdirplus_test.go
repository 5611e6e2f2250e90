package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var lookupLine = regexp.MustCompile(`rx \d+: LOOKUP n\d+\s+"([^"]*)"`)

// requestLog reads the FUSE requests a withDebug server logged.
type requestLog struct {
	sb    *sandbox
	from  int // where the current span starts in sb.log
	marks int
}

// span waits until the server logged every request made before the
// call (a LOOKUP of a name that does not exist is the marker), returns
// the names looked up since the last span, and starts a new span.
func (r *requestLog) span(t *testing.T) []string {
	t.Helper()
	return lookups(r.spanText(t))
}

// lookups lists the names a request log text looked up, sorted.
func lookups(text string) []string {
	var names []string
	for _, m := range lookupLine.FindAllStringSubmatch(text, -1) {
		if !strings.HasPrefix(m[1], "mark-") {
			names = append(names, m[1])
		}
	}
	sort.Strings(names)
	return names
}

// spanText is span's request log text.
func (r *requestLog) spanText(t *testing.T) string {
	t.Helper()
	r.marks++
	mark := fmt.Sprintf("mark-%d-absent", r.marks)
	_, err := os.Lstat(r.sb.path(mark))
	require.ErrorIs(t, err, os.ErrNotExist)
	var text string
	deadline := time.Now().Add(10 * time.Second)
	for {
		text = r.sb.log.String()[r.from:]
		if i := strings.Index(text, `"`+mark+`"`); i >= 0 {
			text = text[:i]
			break
		}
		require.True(t, time.Now().Before(deadline), "the server never logged the LOOKUP of %s", mark)
		time.Sleep(10 * time.Millisecond)
	}
	r.from = strings.Index(r.sb.log.String(), `"`+mark+`"`) + len(mark) + 2
	return text
}

// TestReaddirplusAttributes: a listing carries the attributes of the
// entries someone will need and no others, and those it carries are
// right.
//   - A walk (find) costs no inode read per file: files come without
//     attributes, so a later stat of one looks it up; directories come
//     with them, so entering one needs no LOOKUP.
//   - Once entries of a directory are statted (ls -l, du, tar), the
//     listings of it, of its subdirectories and of its sibling
//     directories carry the files' attributes: statting them needs no
//     LOOKUP, and the attributes are the original's; rm -r of the
//     siblings unlinks each file without looking it up first.
func TestReaddirplusAttributes(t *testing.T) {
	files := map[string]string{}
	for i := 0; i < 40; i++ {
		files[fmt.Sprintf("walk/f%02d", i)] = strings.Repeat("w", i)
		files[fmt.Sprintf("walk/sub%d/g%02d", i%3, i)] = "g"
		files[fmt.Sprintf("stat/f%02d", i)] = strings.Repeat("s", i)
		files[fmt.Sprintf("stat/sub/h%02d", i)] = strings.Repeat("h", 2*i)
		files[fmt.Sprintf("rm/d%d/r%02d", i%4, i)] = "r"
	}
	orig := newOrig(t, files)
	require.NoError(t, os.Chmod(filepath.Join(orig, "stat/sub/h07"), 0o4711))
	sb := mountSandbox(t, orig, withDebug())
	require.False(t, sb.useStandIn(), "this test reads the CLI server's --debug log")
	reqs := &requestLog{sb: sb}
	reqs.span(t)

	out, err := runTimeout(30*time.Second, "find", sb.path("walk"))
	require.NoError(t, err, "find: %s", out)
	want, err := runTimeout(30*time.Second, "find", filepath.Join(orig, "walk"))
	require.NoError(t, err)
	sorted := func(s string) []string {
		l := strings.Split(strings.TrimSpace(s), "\n")
		sort.Strings(l)
		return l
	}
	assert.Equal(t, sorted(strings.ReplaceAll(string(want), orig, sb.mnt)), sorted(string(out)), "find lists the original")
	assert.Equal(t, []string{"walk"}, reqs.span(t), "find looked up only its starting point: directories came with their attributes")

	lstat(t, sb.path("walk/f03"))
	assert.Equal(t, []string{"f03"}, reqs.span(t), "a file listed by find came without attributes, so stat looks it up")

	// Someone stats the entries of stat/: its subdirectory's listing
	// carries the attributes.
	lstat(t, sb.path("stat/f01"))
	assert.Equal(t, []string{"f01", "stat"}, reqs.span(t))
	ents, err := os.ReadDir(sb.path("stat/sub"))
	require.NoError(t, err)
	require.Len(t, ents, 40)
	reqs.span(t)
	for _, e := range ents {
		var got, orig2 unix.Stat_t
		require.NoError(t, unix.Lstat(sb.path("stat/sub", e.Name()), &got))
		require.NoError(t, unix.Lstat(filepath.Join(orig, "stat/sub", e.Name()), &orig2))
		assert.Equal(t, orig2.Mode, got.Mode, e.Name())
		assert.Equal(t, orig2.Size, got.Size, e.Name())
		assert.Equal(t, orig2.Ino, got.Ino, e.Name())
		assert.Equal(t, orig2.Mtim, got.Mtim, e.Name())
		assert.Equal(t, orig2.Uid, got.Uid, e.Name())
	}
	assert.Empty(t, reqs.span(t), "files listed with their attributes need no LOOKUP")

	// rm -r: the first directory's files are looked up (listed before
	// anyone statted anything near them); its siblings' listings then
	// carry the attributes, and their files are unlinked without a LOOKUP.
	out, err = runTimeout(30*time.Second, "rm", "-r", sb.path("rm"))
	require.NoError(t, err, "rm -r: %s", out)
	assert.NoDirExists(t, sb.path("rm"))
	var looked []string // the files rm -r looked up
	for _, name := range reqs.span(t) {
		if regexp.MustCompile(`^r\d\d$`).MatchString(name) {
			looked = append(looked, name)
		}
	}
	assert.LessOrEqual(t, len(looked), 10, "rm -r of 4 directories of 10 files looks up the files of the first one only: %v", looked)
	assert.NotEmpty(t, looked, "the first directory's files came without attributes")
}

// TestSetattrKeepsAttributes: the attributes a SETATTR answers are kept by
// the kernel like those of a GETATTR, so a stat right after chmod, chown
// or utimes costs no round trip, and shows the change.
func TestSetattrKeepsAttributes(t *testing.T) {
	orig := newOrig(t, map[string]string{"f": "data"})
	sb := mountSandbox(t, orig, withDebug())
	require.False(t, sb.useStandIn(), "this test reads the CLI server's --debug log")
	reqs := &requestLog{sb: sb}
	lstat(t, sb.path("f"))
	reqs.span(t)
	require.NoError(t, os.Chmod(sb.path("f"), 0o600))
	require.NoError(t, os.Chtimes(sb.path("f"), time.Unix(1000, 0), time.Unix(2000, 0)))
	st := lstat(t, sb.path("f"))
	assert.Equal(t, uint32(0o600), st.Mode&0o7777)
	assert.Equal(t, int64(2000), st.Mtim.Sec)
	text := reqs.spanText(t)
	assert.Equal(t, 2, strings.Count(text, ": SETATTR "), "requests:\n%s", text)
	assert.NotRegexp(t, `: (GETATTR|STATX) `, text, "a stat after a setattr asked the server again")
}

// TestWarmWalkAsksNothing: directories are read without OPENDIR and
// RELEASEDIR (the server answers OPENDIR with ENOSYS, so the kernel stops
// sending them and keeps every listing it read whole), so a warm walk of
// a tree asks the server nothing at all; a name made through the mount
// shows in the next walk, and one removed is gone.
func TestWarmWalkAsksNothing(t *testing.T) {
	files := map[string]string{}
	for i := 0; i < 30; i++ {
		files[fmt.Sprintf("t/d%d/e%d/f%02d", i%5, i%2, i)] = "x"
	}
	orig := newOrig(t, files)
	sb := mountSandbox(t, orig, withDebug())
	require.False(t, sb.useStandIn(), "this test reads the CLI server's --debug log")
	reqs := &requestLog{sb: sb}
	reqs.span(t)
	walk := func() []string {
		t.Helper()
		out, err := runTimeout(30*time.Second, "find", sb.path("t"))
		require.NoError(t, err, "find: %s", out)
		l := strings.Split(strings.TrimSpace(strings.ReplaceAll(string(out), sb.mnt+"/", "")), "\n")
		sort.Strings(l)
		return l
	}
	want := []string{"t"}
	for name := range files {
		want = append(want, name)
		for d := filepath.Dir(name); d != "t"; d = filepath.Dir(d) {
			if !slices.Contains(want, d) {
				want = append(want, d)
			}
		}
	}
	sort.Strings(want)

	assert.Equal(t, want, walk(), "the first walk")
	text := reqs.spanText(t)
	assert.LessOrEqual(t, strings.Count(text, ": OPENDIR "), 1, "OPENDIRs in the first walk (the first of the mount is answered ENOSYS, and is the last):\n%s", text)
	assert.NotContains(t, text, ": RELEASEDIR ", "the first walk")
	assert.Regexp(t, `: READDIR`, text, "the first walk read no directory")

	// The kernel forgets a directory's atime after reading it from the
	// server (fuse_invalidate_atime), so find's fstat of each directory
	// in the second walk asks for attributes; the third asks nothing.
	requests := regexp.MustCompile(`rx \d+: ([A-Z]+) `)
	asked := func(text string) []string {
		var ops []string
		for _, m := range requests.FindAllStringSubmatch(text, -1) {
			if m[1] != "STATFS" { // find's one statfs a walk
				ops = append(ops, m[1])
			}
		}
		return ops[:len(ops)-1] // the marker's LOOKUP
	}
	assert.Equal(t, want, walk(), "the second walk")
	text = reqs.spanText(t)
	for _, op := range asked(text) {
		assert.Equal(t, "GETATTR", op, "the second walk asked the server:\n%s", text)
	}
	assert.Equal(t, want, walk(), "the third walk")
	text = reqs.spanText(t)
	assert.Empty(t, asked(text), "the third walk asked the server:\n%s", text)

	require.NoError(t, os.WriteFile(sb.path("t/d1/new"), nil, 0o644))
	require.NoError(t, os.Remove(sb.path("t/d2/e0/f02")))
	want = append(slices.DeleteFunc(want, func(s string) bool { return s == "t/d2/e0/f02" }), "t/d1/new")
	sort.Strings(want)
	assert.Equal(t, want, walk(), "a walk after a create and a remove")
	assert.Equal(t, want, walk(), "the walk after that")
}
