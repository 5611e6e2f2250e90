package commit

import (
	"encoding/json"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func validLog() []byte {
	b, _ := json.Marshal(undoLog{Version: undoLogVersion, ID: "x", State: statePrepared, Original: "/o", Txn: "/w/txn-x",
		Steps: []step{{Kind: opDetach, Path: "a/b", Slot: "b/1"}, {Kind: opMeta, Path: "a", New: &meta{Mode: 0o755}}}})
	return b
}

func TestDecodeUndoLogRejectsDamage(t *testing.T) {
	_, err := decodeUndoLog(validLog())
	require.NoError(t, err)
	bad := map[string]string{
		"escaping path":   `"path":"a/b"` + "|" + `"path":"../etc/passwd"`,
		"absolute path":   `"path":"a/b"` + "|" + `"path":"/etc/passwd"`,
		"escaping slot":   `"slot":"b/1"` + "|" + `"slot":"../../x"`,
		"unknown kind":    `"kind":"detach"` + "|" + `"kind":"rm"`,
		"newer version":   `"version":1` + "|" + `"version":2`,
		"unknown state":   `"state":"prepared"` + "|" + `"state":"half"`,
		"relative origin": `"original":"/o"` + "|" + `"original":"o"`,
	}
	for name, sub := range bad {
		parts := strings.SplitN(sub, "|", 2)
		data := strings.Replace(string(validLog()), parts[0], parts[1], 1)
		require.NotEqual(t, string(validLog()), data, name)
		_, err := decodeUndoLog([]byte(data))
		assert.ErrorIs(t, err, ErrUndoLog, name)
	}
}

func FuzzDecodeUndoLog(f *testing.F) {
	f.Add(validLog())
	f.Add([]byte(`{}`))
	f.Add(validLog()[:40])
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := decodeUndoLog(data)
		if err != nil {
			return
		}
		for _, s := range l.Steps {
			for _, p := range []string{s.Path, s.Slot} {
				j := filepath.Join("/root", p)
				if !strings.HasPrefix(j, "/root/") && j != "/root" {
					t.Fatalf("step path %q escapes its root", p)
				}
			}
		}
	})
}

// TestRevertMeta: the undo of a metadata step sets back each part the
// step set, and leaves each part another process changed since, or the
// step never reached (an apply that crashed within setMeta).
func TestRevertMeta(t *testing.T) {
	old := &meta{Mode: 0o100644, Uid: 1, Gid: 1, Atime: 10, Mtime: 10, Xattrs: map[string][]byte{"user.a": []byte("old"), "user.gone": []byte("g")}}
	new := &meta{Mode: 0o100600, Uid: 2, Gid: 2, Atime: 20, Mtime: 20, Xattrs: map[string][]byte{"user.a": []byte("new"), "user.b": []byte("new")}}
	with := func(m meta, f func(m *meta)) *meta {
		m.Xattrs = maps.Clone(m.Xattrs)
		f(&m)
		return &m
	}
	for _, tc := range []struct {
		name string
		cur  *meta
		want *meta // nil: nothing to set
	}{
		{"as the step left it", new, old},
		{"never reached", old, nil},
		{"mode changed since", with(*new, func(m *meta) { m.Mode = 0o100640 }),
			with(*old, func(m *meta) { m.Mode = 0o100640 })},
		{"owner set, nothing else", with(*old, func(m *meta) { m.Uid, m.Gid = 2, 2 }), old},
		{"written since (mtime)", with(*new, func(m *meta) { m.Mtime = 30 }),
			with(*old, func(m *meta) { m.Atime, m.Mtime = 20, 30 })},
		{"attributes changed since", with(*new, func(m *meta) { m.Xattrs["user.a"] = []byte("other"); m.Xattrs["user.c"] = []byte("c") }),
			with(*old, func(m *meta) { m.Xattrs["user.a"] = []byte("other"); m.Xattrs["user.c"] = []byte("c") })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, revertMeta(tc.cur, old, new))
		})
	}
}

// The undo log keeps paths and attribute names that are not UTF-8 byte for
// byte, wherever in the log they are, and writing it changes nothing of
// the transaction's own log in memory.
func TestUndoLogKeepsNamesByteForByte(t *testing.T) {
	mk := func() *undoLog {
		return &undoLog{ID: "x", State: statePrepared, Original: "/o/caf\xe9", Txn: "/o/txn-x", Steps: []step{
			{Kind: opDetach, Path: "a/b", Slot: "b/1"},
			{Kind: opInstall, Path: "a/n", Slot: "n/2", Staged: &stagedFile{Size: 1, Mtime: 2}},
			{Kind: opInstall, Path: "d\xff/f\xfe", Slot: "n/3", Strip: map[string][]byte{"trusted.overlay.origin": {1}}},
			{Kind: opMeta, Path: "a", Old: &meta{Mode: 0o755, Xattrs: map[string][]byte{"user.ok": {2}}},
				New: &meta{Mode: 0o700, Xattrs: map[string][]byte{"user.\xe9t\xe9": {3}, "user.ok": {2}}}},
			{Kind: opMkdir, Path: "z"},
		}}
	}
	work := t.TempDir()
	l := mk()
	require.NoError(t, writeUndoLog(work, l))
	want := mk()
	want.Version = undoLogVersion
	assert.Equal(t, want, l, "the log in memory is as it was")
	got, err := readUndoLog(work)
	require.NoError(t, err)
	assert.Equal(t, want, got)

	plain := &undoLog{ID: "x", State: statePrepared, Original: "/o", Txn: "/o/txn-x", Steps: []step{{Kind: opMkdir, Path: "z"}}}
	assert.Same(t, &plain.Steps[0], &plain.encoded().Steps[0], "a log with nothing to encode is not copied")
}
