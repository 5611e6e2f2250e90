package layers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A sandbox of a directory whose path is not UTF-8 binds to it and stays
// bound: sandbox.json keeps the path byte for byte. Before, JSON wrote
// U+FFFD, and the next Bind refused the sandbox as another original's.
func TestBindKeepsAPathThatIsNotUTF8(t *testing.T) {
	dir := t.TempDir()
	orig, upper, work := filepath.Join(dir, "caf\xe9"), filepath.Join(dir, "u\xff", "upper"), filepath.Join(dir, "u\xff", "work")
	for _, d := range []string{orig, upper, work} {
		require.NoError(t, os.MkdirAll(d, 0o700))
	}
	cfg := Config{Lowers: []string{orig}, Upper: upper, Work: work}
	require.NoError(t, Bind(&cfg))
	again := Config{Lowers: []string{orig}, Upper: upper, Work: work}
	require.NoError(t, Bind(&again), "the same layers bind again")
	m, err := ReadMeta(work)
	require.NoError(t, err)
	assert.Equal(t, []string{orig}, m.Lowers)
	assert.Equal(t, upper, m.Upper)

	other := Config{Lowers: []string{filepath.Join(dir, "caf\xe8")}, Upper: upper, Work: work}
	assert.ErrorIs(t, Bind(&other), ErrMetaMismatch, "another original whose name differs in a byte that is not UTF-8")
}

// A Change comes back from JSON byte for byte, with path_b64 (from_b64,
// original_b64, replaced_b64) beside a path that is not UTF-8, and as
// plain JSON otherwise.
func TestChangeJSONRoundTrips(t *testing.T) {
	for _, c := range []Change{
		{Path: "a/b", Kind: Modified, Type: "file"},
		{Path: "n\xe0", Kind: Renamed, From: "o\xff", Type: "file"},
		{Path: "x", Kind: Deleted, Original: "d\xfe/x", Replaced: "y\xfd", Type: "dir"},
	} {
		b, err := json.Marshal(c)
		require.NoError(t, err)
		var back Change
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, c, back, "%s", b)
	}
	b, err := json.Marshal(Change{Path: "a/b", Kind: Modified, Type: "file"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"path":"a/b","kind":"modified","type":"file"}`, string(b))
	b, err = json.Marshal(Change{Path: "n\xe0", Kind: Created, Type: "file"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"path":"n\ufffd","path_b64":"buA=","kind":"created","type":"file"}`, string(b))
}
