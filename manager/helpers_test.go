package manager

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// Every test runs with the lock-order checker on: a lock taken out of
// order anywhere panics.
func TestMain(m *testing.M) {
	checkLockOrder.Store(true)
	code := m.Run()
	if testdaemonBuild.dir != "" {
		os.RemoveAll(testdaemonBuild.dir)
	}
	os.Exit(code)
}

// testHandler sends the manager's log to the test's log; strict makes any
// warning or error fail the test.
type testHandler struct {
	t      testing.TB
	strict bool
	attrs  []slog.Attr
}

func (h *testHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *testHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	h.t.Log(b.String())
	if h.strict && r.Level >= slog.LevelWarn {
		h.t.Errorf("unexpected log: %s", b.String())
	}
	return nil
}

func (h *testHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return &testHandler{t: h.t, strict: h.strict, attrs: append(h.attrs, a...)}
}
func (h *testHandler) WithGroup(string) slog.Handler { return h }

// open opens a manager on root that is closed when the test ends. Any
// warning it logs fails the test unless lenient.
func open(t testing.TB, root string, lenient ...bool) *Manager {
	t.Helper()
	m, err := New(Options{StateRoot: root, Logger: slog.New(&testHandler{t: t, strict: len(lenient) == 0})})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// makeTree creates files under a new directory: "p/" is a directory,
// anything else a file with that content.
func makeTree(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, v := range files {
		full := filepath.Join(dir, p)
		if strings.HasSuffix(p, "/") {
			require.NoError(t, os.MkdirAll(full, 0o755))
			continue
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(v), 0o644))
	}
	return dir
}

// snapshot maps every path under dir to its content ("dir" for a
// directory).
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			out[rel] = "dir"
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	})
	require.NoError(t, err)
	return out
}

// editor changes an unmounted sandbox through layers, as its mount would.
type editor struct {
	t testing.TB
	l *layers.Layers
}

// edit opens sandbox id's layers, runs f and closes them (the journal is
// on disk before any commit).
func edit(t testing.TB, m *Manager, id string, f func(e *editor)) {
	t.Helper()
	cfg, err := m.Config(id)
	require.NoError(t, err)
	l, err := layers.Open(cfg)
	require.NoError(t, err)
	f(&editor{t: t, l: l})
	require.NoError(t, l.Close())
}

func (e *editor) lookup(p string) (layers.Obj, bool) {
	en, err := e.l.Root()
	require.NoError(e.t, err)
	dir := ""
	for _, name := range strings.Split(p, "/") {
		if name == "" {
			continue
		}
		en, err = e.l.Lookup(dir, en.Obj, name)
		if err != nil {
			return layers.Obj{}, false
		}
		dir = layers.Join(dir, name)
	}
	return en.Obj, true
}

func split(p string) (string, string) {
	d, n := filepath.Split(p)
	return strings.TrimSuffix(d, "/"), n
}

// write creates or replaces the file p with data.
func (e *editor) write(p, data string) {
	d, n := split(p)
	dir, ok := e.lookup(d)
	require.True(e.t, ok, "no directory %q", d)
	var fd int
	var err error
	if o, ok := e.lookup(p); ok {
		fd, _, err = e.l.Open(p, &o, unix.O_WRONLY|unix.O_TRUNC, layers.Caller{})
	} else {
		fd, _, err = e.l.Create(d, dir, n, 0o644, layers.Caller{})
	}
	require.NoError(e.t, err)
	_, err = unix.Write(fd, []byte(data))
	require.NoError(e.t, err)
	require.NoError(e.t, unix.Close(fd))
}

// read returns the content of p as the sandbox shows it.
func (e *editor) read(p string) string {
	o, ok := e.lookup(p)
	require.True(e.t, ok, "no %q in the sandbox", p)
	fd, _, err := e.l.Open(p, &o, unix.O_RDONLY, layers.Caller{})
	require.NoError(e.t, err)
	defer unix.Close(fd)
	buf := make([]byte, 1<<16)
	n, err := unix.Read(fd, buf)
	require.NoError(e.t, err)
	return string(buf[:n])
}

func (e *editor) mkdir(p string) {
	d, n := split(p)
	dir, ok := e.lookup(d)
	require.True(e.t, ok)
	_, err := e.l.Mkdir(d, dir, n, 0o755, layers.Caller{})
	require.NoError(e.t, err)
}

func (e *editor) remove(p string) {
	d, n := split(p)
	dir, ok := e.lookup(d)
	require.True(e.t, ok)
	require.NoError(e.t, e.l.Unlink(d, dir, n, layers.Caller{}))
}

// fixture is a plan of sandboxes over originals of the same shape, each
// changed the same way: f modified, new created, gone deleted, sub/n
// created, dir/ made.
type fixture struct {
	m     *Manager
	root  string
	plan  string
	origs []string
	ids   []string
	old   []map[string]string
}

var fixtureFiles = map[string]string{"f": "old", "gone": "bye", "sub/keep": "k", "empty/": ""}

func newFixture(t testing.TB, m *Manager, plan string, n int) *fixture {
	t.Helper()
	fx := &fixture{m: m, root: m.StateRoot(), plan: plan}
	for i := 0; i < n; i++ {
		orig := makeTree(t, fixtureFiles)
		sb, err := m.Create(context.Background(), CreateOptions{Plan: plan, Original: orig, Name: fmt.Sprint("sandbox ", i)})
		require.NoError(t, err)
		fx.origs = append(fx.origs, orig)
		fx.ids = append(fx.ids, sb.ID)
		fx.old = append(fx.old, snapshot(t, orig))
		fx.change(t, i)
	}
	return fx
}

// change makes sandbox i's changes (again, after a commit with keep).
func (fx *fixture) change(t testing.TB, i int) {
	edit(t, fx.m, fx.ids[i], func(e *editor) {
		e.write("f", fmt.Sprint("new ", i))
		e.write("new", "created")
		e.remove("gone")
		e.write("sub/n", "n")
		e.mkdir("dir")
		e.mkdir("tree") // a new tree: in with one rename
		e.mkdir("tree/d")
		e.write("tree/d/x", "x")
	})
}

// want is what original i holds after its commit.
func (fx *fixture) want(i int) map[string]string {
	w := map[string]string{}
	for k, v := range fx.old[i] {
		w[k] = v
	}
	delete(w, "gone")
	w["f"], w["new"], w["sub/n"], w["dir"] = fmt.Sprint("new ", i), "created", "n", "dir"
	w["tree"], w["tree/d"], w["tree/d/x"] = "dir", "dir", "x"
	return w
}

// allOld and allNew check every original.
func (fx *fixture) allOld(t testing.TB) {
	t.Helper()
	for i, o := range fx.origs {
		require.Equal(t, fx.old[i], snapshot(t, o), "original %d must be unchanged", i)
	}
}

func (fx *fixture) allNew(t testing.TB) {
	t.Helper()
	for i, o := range fx.origs {
		require.Equal(t, fx.want(i), snapshot(t, o), "original %d must hold every change", i)
	}
}

// states returns the state of every sandbox of the fixture.
func (fx *fixture) states(t testing.TB, m *Manager) []State {
	t.Helper()
	var out []State
	for _, id := range fx.ids {
		sb, err := m.Get(id)
		require.NoError(t, err)
		out = append(out, sb.State)
	}
	return out
}

func repeat(s State, n int) []State {
	out := make([]State, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// chattr sets or clears the immutable flag of p (root only); the flag is
// cleared when the test ends.
func needRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chattr +i)")
	}
}
