package layers

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rebind records a moved original's new place, and refuses what is not a
// move: the recorded place still there, another upper, another number of
// layers. Nothing else of the record changes.
func TestRebind(t *testing.T) {
	dir := t.TempDir()
	orig, upper, work := filepath.Join(dir, "orig"), filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{orig, upper, work} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	cfg := Config{Lowers: []string{orig}, Upper: upper, Work: work}
	require.NoError(t, Bind(&cfg))
	before, err := ReadMeta(work)
	require.NoError(t, err)

	moved := filepath.Join(dir, "moved")
	require.NoError(t, os.Mkdir(moved, 0o700))
	assert.ErrorIs(t, Rebind(&Config{Lowers: []string{moved}, Upper: upper, Work: work}), ErrStillThere)
	require.NoError(t, os.Remove(moved))
	require.NoError(t, os.Rename(orig, moved))
	assert.ErrorIs(t, Rebind(&Config{Lowers: []string{moved}, Upper: filepath.Join(dir, "x"), Work: work}), ErrMetaMismatch)
	assert.ErrorIs(t, Rebind(&Config{Lowers: []string{moved, dir}, Upper: upper, Work: work}), ErrMetaMismatch)
	m, err := ReadMeta(work)
	require.NoError(t, err)
	assert.Equal(t, before, m, "a refused rebind changes nothing")

	require.NoError(t, Rebind(&Config{Lowers: []string{moved}, Upper: upper, Work: work}))
	m, err = ReadMeta(work)
	require.NoError(t, err)
	want := *before
	want.Lowers = []string{moved}
	assert.Equal(t, &want, m)
	require.NoError(t, Bind(&Config{Lowers: []string{moved}, Upper: upper, Work: work}), "the sandbox binds at the new place")
	require.NoError(t, Rebind(&Config{Lowers: []string{moved}, Upper: upper, Work: work}), "nothing to rebind")
}
