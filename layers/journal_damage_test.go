package layers

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeJournal writes a journal of n records and returns its path and the
// offset where each record starts.
func writeJournal(t *testing.T, n int) (string, []int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := OpenJournal(path)
	require.NoError(t, err)
	var offs []int
	for i := 0; i < n; i++ {
		st, err := os.Stat(path)
		require.NoError(t, err)
		offs = append(offs, int(st.Size()))
		require.NoError(t, j.Append(Record{Op: OpCreate, Path: "dir/file" + string(rune('a'+i))}))
	}
	require.NoError(t, j.Close())
	return path, offs
}

// A crash leaves part of the last record (or zeros): not damage. A byte
// flipped in an earlier record is: every record after it would be lost
// silently, so reading refuses and a commit cannot go on.
func TestJournalTornTailVersusDamage(t *testing.T) {
	path, offs := writeJournal(t, 5)
	data, err := os.ReadFile(path)
	require.NoError(t, err)

	require.NoError(t, os.WriteFile(path, data[:len(data)-3], 0o600))
	recs, err := ReadJournal(path)
	require.NoError(t, err, "a torn last record")
	assert.Len(t, recs, 4)

	zeros := append(append([]byte{}, data...), make([]byte, 4096)...)
	require.NoError(t, os.WriteFile(path, zeros, 0o600))
	recs, err = ReadJournal(path)
	require.NoError(t, err, "zeros past the end")
	assert.Len(t, recs, 5)

	flipped := append([]byte{}, data...)
	flipped[offs[1]+12] ^= 0x40
	require.NoError(t, os.WriteFile(path, flipped, 0o600))
	recs, err = ReadJournal(path)
	assert.ErrorIs(t, err, ErrJournalDamaged)
	assert.Len(t, recs, 1, "the records before the damage")

	// Opening it (a mount) sets the damaged part aside, and the set-aside
	// copy keeps a commit from going on.
	j, err := OpenJournal(path)
	require.NoError(t, err)
	require.NoError(t, j.Close())
	assert.ErrorIs(t, CheckJournalIntact(path), ErrJournalDamaged)
}

// Records naming paths that lead out of the sandbox are refused.
func TestChangeSetRefusesEscapingJournalPaths(t *testing.T) {
	for _, r := range []Record{
		{Op: OpCreate, Path: "../outside"},
		{Op: OpCreate, Path: "/etc/passwd"},
		{Op: OpRename, Path: "a", Path2: "a/../../b"},
		{Op: OpLink, Path: "a", Path2: "b//c"},
	} {
		s := newStack(t, map[string]string{"a": "1"})
		_, err := s.changes([]Record{r})
		assert.ErrorIs(t, err, ErrJournalDamaged, "%+v", r)
	}
}
