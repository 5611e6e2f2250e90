package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
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
	require.NoError(t, printChanges(&out, changes, collapseAbove))
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
	require.NoError(t, printChanges(&out, nil, collapseAbove))
	assert.Equal(t, "no changes\n", out.String())

	out.Reset()
	require.NoError(t, printChanges(&out, changes[:1], collapseAbove))
	assert.Equal(t, "A new\n1 change: 1 created\n", out.String())
}

// A new directory with more than collapseAbove entries, all new, is one
// line; one with a link, a removal or a change of an original path
// beneath is listed entry by entry, down to its wholly new
// subdirectories. d-x sorts between d and d/... (byte-wise), and must
// neither break d's run nor be swallowed by it.
func TestPrintChangesCollapsesLargeNewDirectories(t *testing.T) {
	t.Parallel()
	created := func(p, typ string) layers.Change { return layers.Change{Path: p, Kind: layers.Created, Type: typ} }
	var changes []layers.Change
	changes = append(changes, created("d", "dir"), created("d-x", "file"))
	for i := 0; i < 150; i++ {
		changes = append(changes, created(fmt.Sprintf("d/%03d", i), "file"))
	}
	changes = append(changes, created("d/sub", "dir"), created("d/sub/f", "file"))
	changes = append(changes, created("mixed", "dir"), layers.Change{Path: "mixed/hl", Kind: layers.Linked, From: "orig", Type: "file"})
	changes = append(changes, created("mixed/new", "dir"))
	for i := 0; i < 101; i++ {
		changes = append(changes, created(fmt.Sprintf("mixed/new/%03d", i), "file"))
	}
	changes = append(changes, created("small", "dir"))
	for i := 0; i < 100; i++ {
		changes = append(changes, created(fmt.Sprintf("small/%03d", i), "file"))
	}
	changes = append(changes, layers.Change{Path: "z", Kind: layers.Modified, Type: "file"})
	require.True(t, slices.IsSortedFunc(changes, func(a, b layers.Change) int { return strings.Compare(a.Path, b.Path) }))

	var out bytes.Buffer
	require.NoError(t, printChanges(&out, changes, collapseAbove))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := []string{"A d/ (152 entries)", "A d-x", "A mixed", "L orig -> mixed/hl", "A mixed/new/ (101 entries)", "A small"}
	assert.Equal(t, want, lines[:len(want)])
	assert.Equal(t, "A small/000", lines[len(want)], "100 entries are listed")
	assert.Len(t, lines, len(want)+100+2)
	assert.Equal(t, "M z", lines[len(lines)-2])
	assert.Equal(t, fmt.Sprintf("%d changes: %d created, 1 modified, 1 linked", len(changes), len(changes)-2), lines[len(lines)-1],
		"the summary counts every entry")

	out.Reset()
	require.NoError(t, printChanges(&out, changes, 0))
	assert.Equal(t, len(changes)+1, strings.Count(out.String(), "\n"), "--all lists every entry")

	// Out of order (never from StatusListing): nothing is collapsed
	// rather than something miscounted.
	shuffled := append([]layers.Change{changes[len(changes)-1]}, changes[:len(changes)-1]...)
	out.Reset()
	require.NoError(t, printChanges(&out, shuffled, collapseAbove))
	assert.Equal(t, len(changes)+1, strings.Count(out.String(), "\n"))
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
