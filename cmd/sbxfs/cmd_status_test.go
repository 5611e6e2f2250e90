package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/layers"
)

func TestPrintChanges(t *testing.T) {
	t.Parallel()
	changes := []layers.Change{
		{Path: "new", Kind: layers.Created, Type: "file"},
		{Path: "dir/edited", Kind: layers.Modified, Type: "file"},
		{Path: "chmodded", Kind: layers.Metadata, Type: "dir"},
		{Path: "gone", Kind: layers.Deleted, Type: "symlink"},
		{Path: "b", Kind: layers.Renamed, From: "a", Type: "file"},
		{Path: "hard", Kind: layers.Linked, From: "b", Type: "file"},
		{Path: "line\nbreak", Kind: layers.Created, Type: "file"},
		{Path: "bad\xffutf8", Kind: layers.Created, Type: "file"},
		{Path: "spaced name é", Kind: layers.Created, Type: "file"},
	}
	var out bytes.Buffer
	require.NoError(t, printChanges(&out, changes))
	want := `A new
M dir/edited
m chmodded
D gone
R a -> b
L b -> hard
A "line\nbreak"
A "bad\xffutf8"
A spaced name é
9 changes: 4 created, 1 modified, 1 metadata, 1 deleted, 1 renamed, 1 linked
`
	assert.Equal(t, want, out.String())

	out.Reset()
	require.NoError(t, printChanges(&out, nil))
	assert.Equal(t, "no changes\n", out.String())

	out.Reset()
	require.NoError(t, printChanges(&out, changes[:1]))
	assert.Equal(t, "A new\n1 change: 1 created\n", out.String())
}

func TestChangeJSONRoundTrip(t *testing.T) {
	t.Parallel()
	ch := layers.Change{Path: "x\xfe/y", Kind: layers.Renamed, From: "old\x80", Type: "file"}
	b, err := json.Marshal(toChangeJSON(ch))
	require.NoError(t, err)
	var got changeJSON
	require.NoError(t, json.Unmarshal(b, &got))
	p, err := base64.StdEncoding.DecodeString(got.PathB64)
	require.NoError(t, err)
	f, err := base64.StdEncoding.DecodeString(got.FromB64)
	require.NoError(t, err)
	assert.Equal(t, ch.Path, string(p))
	assert.Equal(t, ch.From, string(f))

	b, err = json.Marshal(toChangeJSON(layers.Change{Path: "ok/é", Kind: layers.Created, Type: "file"}))
	require.NoError(t, err)
	assert.JSONEq(t, `{"path":"ok/é","kind":"created","type":"file"}`, string(b))
}
