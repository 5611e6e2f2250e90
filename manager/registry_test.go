package manager

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A sandbox made by one manager is seen by the next (PITFALLS 24).
func TestRegistrySurvivesANewManager(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	a := newFixture(t, m, "a", 2)
	b := newFixture(t, m, "b", 1)
	_, err := m.Commit(ctx, b.ids[0], CommitOptions{})
	require.NoError(t, err)
	before := m.List("")
	require.Len(t, before, 3)
	require.NoError(t, m.Close())
	_, err = m.Get(a.ids[0])
	require.NoError(t, err, "Get works from memory after Close")
	_, err = m.Create(ctx, CreateOptions{Original: t.TempDir()})
	assert.ErrorIs(t, err, ErrClosed)

	m2 := open(t, root)
	after := m2.List("")
	require.Len(t, after, 3)
	for i := range before {
		assert.Equal(t, before[i].ID, after[i].ID)
		assert.Equal(t, before[i].State, after[i].State)
		assert.Equal(t, before[i].Plan, after[i].Plan)
		assert.Equal(t, before[i].Original, after[i].Original)
		assert.Equal(t, before[i].Mountpoint, after[i].Mountpoint)
		assert.True(t, before[i].Created.Equal(after[i].Created))
	}
	assert.Len(t, m2.List("a"), 2)
	a.m = m2
	_, err = m2.CommitPlan(ctx, "a", CommitOptions{})
	require.NoError(t, err, "the second manager commits what the first created")
	a.allNew(t)
}

func TestRecordFileIsPrivateAndVersioned(t *testing.T) {
	m := open(t, t.TempDir())
	sb, err := m.Create(ctx, CreateOptions{Original: makeTree(t, nil), Name: "n"})
	require.NoError(t, err)
	st, err := os.Stat(filepath.Join(sb.Dir, recordName))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	// (The upper's root takes the original's mode: it is the mount's root.)
	for _, d := range []string{m.StateRoot(), sb.Dir, sb.Work} {
		st, err := os.Stat(d)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), d)
	}
	var raw map[string]any
	b, _ := os.ReadFile(filepath.Join(sb.Dir, recordName))
	require.NoError(t, json.Unmarshal(b, &raw))
	assert.EqualValues(t, recordVersion, raw["version"])
	assert.Equal(t, "active", raw["state"])
	assert.Equal(t, DefaultPlan, sb.Plan)
}

// A damaged record is reported and skipped; it never stops New, and GC
// reports it without removing anything.
func TestDamagedRecord(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	fx := newFixture(t, m, "p", 3)
	require.NoError(t, m.Close())
	garbage := filepath.Join(m.dir(fx.ids[0]), recordName)
	require.NoError(t, os.WriteFile(garbage, []byte(`{"version": 1, "id": "trunc`), 0o600))
	future := filepath.Join(m.dir(fx.ids[1]), recordName)
	b, _ := os.ReadFile(future)
	var r record
	require.NoError(t, json.Unmarshal(b, &r))
	r.Version = recordVersion + 1
	b, _ = json.Marshal(r)
	require.NoError(t, os.WriteFile(future, b, 0o600))

	m = open(t, root, true)
	list := m.List("")
	require.Len(t, list, 1)
	assert.Equal(t, fx.ids[2], list[0].ID)
	res, err := m.GC(ctx)
	var be *BatchError
	require.ErrorAs(t, err, &be)
	assert.Same(t, res, be.Result())
	require.Len(t, res.Failed, 2)
	for _, f := range res.Failed {
		assert.ErrorIs(t, f, ErrDamagedRecord)
		assert.Contains(t, []string{fx.ids[0], fx.ids[1]}, f.ID)
		assert.DirExists(t, m.upper(f.ID), "a damaged record's sandbox is never purged")
	}
	_, err = m.Create(ctx, CreateOptions{Original: makeTree(t, nil)})
	require.NoError(t, err, "the manager works on")
}

// GC finds a directory without a record and records without directories
// (one lost while the manager ran, one while it was closed), purges each
// and reports each.
func TestGC(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	fx := newFixture(t, m, "p", 3)
	require.NoError(t, os.RemoveAll(m.upper(fx.ids[0])))
	require.NoError(t, m.Close())
	require.NoError(t, os.RemoveAll(m.work(fx.ids[1])))
	orphan := filepath.Join(root, "sandboxes", "00000000000000aa")
	require.NoError(t, os.MkdirAll(filepath.Join(orphan, "upper", "x"), 0o700))
	require.NoError(t, os.MkdirAll(filepath.Join(orphan, "work"), 0o700))

	m = open(t, root, true)
	sb, _ := m.Get(fx.ids[1])
	assert.Equal(t, Errored, sb.State, "New errors a sandbox that lost its directories")
	assert.NotEmpty(t, sb.Error)
	res, err := m.GC(ctx)
	require.NoError(t, err)
	assert.Subset(t, res.Done, []string{"00000000000000aa", fx.ids[0], fx.ids[1]})
	assert.NotContains(t, res.Done, fx.ids[2])
	assert.NoDirExists(t, orphan)
	for _, id := range fx.ids[:2] {
		sb, _ := m.Get(id)
		assert.Equal(t, CleanedUp, sb.State)
		assert.NoDirExists(t, sb.Work)
		assert.NoDirExists(t, sb.Mountpoint)
	}
	sb, _ = m.Get(fx.ids[2])
	assert.Equal(t, Active, sb.State)
	assert.DirExists(t, sb.Upper)

	res, err = m.GC(ctx)
	require.NoError(t, err)
	assert.Empty(t, res.Done, "nothing is purged twice (PITFALLS 26, 27)")
}

// A creation that crashed leaves a pending record: New purges it.
func TestInterruptedCreationIsPurged(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	sb, err := m.Create(ctx, CreateOptions{Original: makeTree(t, nil)})
	require.NoError(t, err)
	require.NoError(t, m.Close())
	r, err := readRecord(sb.Dir)
	require.NoError(t, err)
	r.State = Pending
	require.NoError(t, writeRecord(sb.Dir, r))

	m = open(t, root, true)
	got, err := m.Get(sb.ID)
	require.NoError(t, err)
	assert.Equal(t, CleanedUp, got.State)
	assert.NoDirExists(t, sb.Upper)
	assert.NoDirExists(t, sb.Mountpoint)
}

func TestDestroyTwice(t *testing.T) {
	m := open(t, t.TempDir())
	fx := newFixture(t, m, "p", 2)
	sb, _ := m.Get(fx.ids[0])
	require.NoError(t, m.Destroy(ctx, sb.ID))
	require.NoError(t, m.Destroy(ctx, sb.ID), "destroying a destroyed sandbox is fine")
	got, _ := m.Get(sb.ID)
	assert.Equal(t, CleanedUp, got.State)
	for _, d := range []string{sb.Upper, sb.Work, sb.Mountpoint} {
		assert.NoDirExists(t, d)
	}
	fx.allOld(t)
	assert.ErrorIs(t, m.Destroy(ctx, "0123456789abcdef"), ErrNotFound)

	res, err := m.DestroyPlan(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, []string{fx.ids[1]}, res.Done)
	_, err = m.Config(fx.ids[1])
	assert.ErrorIs(t, err, ErrNotActive)
}

// List is ordered by creation time, then id, whatever the map order
// (PITFALLS 30).
func TestListOrder(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	for i := 0; i < 6; i++ {
		_, err := m.Create(ctx, CreateOptions{Plan: "p", Original: makeTree(t, nil)})
		require.NoError(t, err)
	}
	require.NoError(t, m.Close())
	same := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ents, err := os.ReadDir(filepath.Join(root, "sandboxes"))
	require.NoError(t, err)
	var ids []string
	for i, e := range ents {
		r, err := readRecord(filepath.Join(root, "sandboxes", e.Name()))
		require.NoError(t, err)
		r.Created = same
		if i == len(ents)-1 {
			r.Created = same.Add(-time.Hour) // the oldest comes first, whatever its id
			ids = append([]string{r.ID}, ids...)
		} else {
			ids = append(ids, r.ID)
		}
		require.NoError(t, writeRecord(filepath.Join(root, "sandboxes", e.Name()), r))
	}
	m = open(t, root)
	for range 20 {
		var got []string
		for _, sb := range m.List("p") {
			got = append(got, sb.ID)
		}
		assert.Equal(t, ids, got)
	}
}

func TestCreateRefuses(t *testing.T) {
	root := t.TempDir()
	m := open(t, root)
	orig := makeTree(t, map[string]string{"f": "x", "d/": ""})
	full := makeTree(t, map[string]string{"x": "x"})
	used, err := m.Create(ctx, CreateOptions{Original: orig})
	require.NoError(t, err)
	cases := map[string]CreateOptions{
		"no original":             {},
		"missing original":        {Original: filepath.Join(orig, "nope")},
		"original is a file":      {Original: filepath.Join(orig, "f")},
		"mountpoint not empty":    {Original: orig, Mountpoint: full},
		"mountpoint in original":  {Original: orig, Mountpoint: filepath.Join(orig, "d")},
		"original in state root":  {Original: filepath.Join(root, "plans")},
		"state root in original":  {Original: filepath.Dir(root)},
		"mountpoint in use":       {Original: orig, Mountpoint: used.Mountpoint},
		"bad plan":                {Original: orig, Plan: "a/b"},
		"name with a newline":     {Original: orig, Name: "a\nb"},
		"name not UTF-8":          {Original: orig, Name: "caf\xe9"}, // free text: JSON would show another
		"name too long":           {Original: orig, Name: strings.Repeat("n", 257)},
		"mountpoint in a sandbox": {Original: full, Mountpoint: filepath.Join(orig, "d")},
	}
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := m.Create(ctx, o)
			assert.ErrorIs(t, err, ErrInvalid)
		})
	}
	assert.Len(t, m.List(""), 1, "nothing was left behind")
	ents, _ := os.ReadDir(filepath.Join(root, "sandboxes"))
	assert.Len(t, ents, 1)
}
