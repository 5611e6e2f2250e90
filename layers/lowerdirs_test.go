package layers

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openUnder counts this process's descriptors of objects under dir (the
// held lower directories of a stack over dir, and any the reads leak).
func openUnder(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && (target == dir || strings.HasPrefix(target, dir+"/")) {
			n++
		}
	}
	return n
}

// TestHeldLowerDirs: with HoldLowerDirs (the serving process) the reads in
// one directory go through one descriptor of it, kept for the time given
// and no longer, at most heldDirsMax at once; a directory of the original
// replaced meanwhile shows as it was until the hold ends (never anything
// from outside the original), and a Reset lets it go at once.
func TestHeldLowerDirs(t *testing.T) {
	files := map[string]string{"d/pub": "public", "d/sub/f": "f"}
	for i := range 300 {
		files[fmt.Sprintf("many/%d/f", i)] = "x"
	}
	s := newStack(t, files)
	s.HoldLowerDirs(time.Hour)
	d := s.dir("d")
	base := openUnder(t, s.lower) // the layer's root, and its root held
	require.Equal(t, 2, base)
	for range 50 {
		_, err := s.Lookup("d", d, "pub")
		require.NoError(t, err)
		_, err = s.Lookup("d", d, "none")
		require.ErrorIs(t, err, unix.ENOENT)
	}
	assert.Equal(t, "public", s.read("d/pub"))
	assert.Equal(t, base+1, openUnder(t, s.lower), "d held, once")

	for i := range 300 {
		s.read(fmt.Sprintf("many/%d/f", i))
	}
	assert.LessOrEqual(t, openUnder(t, s.lower), 1+heldDirsMax, "at most heldDirsMax held")

	// The original's d replaced by a symlink to a directory outside it.
	secret := filepath.Join(t.TempDir(), "secret")
	writeTree(t, secret, map[string]string{"pub": "SECRET", "x": "SECRET"})
	d = s.dir("d")
	pub, err := s.lookup("d/pub")
	require.NoError(t, err)
	lower := filepath.Join(s.lower, "d")
	require.NoError(t, os.Rename(lower, lower+".away"))
	require.NoError(t, os.Symlink(secret, lower))
	_, err = s.Lookup("d", d, "x")
	assert.ErrorIs(t, err, unix.ENOENT, "held: the directory as it was, which has no x")
	assert.Equal(t, "public", s.readObj("d/pub", pub.Obj), "held: the directory as it was")

	require.NoError(t, s.Reset())
	_, err = s.Lookup("d", d, "x")
	assert.ErrorIs(t, err, unix.ENOENT, "after a Reset the original is read anew: d is no directory")
	_, err = s.Stat("d/pub", pub.Obj)
	assert.ErrorIs(t, err, unix.ENOTDIR)
	assert.Equal(t, 1, openUnder(t, s.lower), "a Reset lets the held directories go (the layer's root stays)")
}

// TestHeldLowerDirsExpire: a held directory is read anew once its time is
// up, and an idle stack closes what it holds.
func TestHeldLowerDirsExpire(t *testing.T) {
	s := newStack(t, map[string]string{"d/a": "a"})
	s.HoldLowerDirs(50 * time.Millisecond)
	d := s.dir("d")
	base := 1 // the layer's root
	_, err := s.Lookup("d", d, "a")
	require.NoError(t, err)
	require.Greater(t, openUnder(t, s.lower), base)

	lower := filepath.Join(s.lower, "d")
	require.NoError(t, os.Rename(lower, lower+".old"))
	writeTree(t, s.lower, map[string]string{"d/b": "b"})
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = s.Lookup("d", d, "b")
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "d/b of the new d not found 5 s after: %v", err)
		time.Sleep(10 * time.Millisecond)
	}
	_, err = s.Lookup("d", d, "a")
	assert.ErrorIs(t, err, unix.ENOENT, "the old d is not read any more")

	for openUnder(t, s.lower) > base {
		require.True(t, time.Now().Before(deadline), "an idle stack still holds %d directories", openUnder(t, s.lower)-base)
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHeldLowerDirsClosedWhileRead: Close while reads use held directories
// (race detector) closes every descriptor, those lent at the time once
// their reads end.
func TestHeldLowerDirsClosedWhileRead(t *testing.T) {
	files := map[string]string{}
	for i := range 20 {
		files[fmt.Sprintf("d%d/f", i)] = "x"
	}
	s := newStack(t, files)
	s.HoldLowerDirs(time.Hour)
	var objs []Obj
	for i := range 20 {
		objs = append(objs, s.dir(fmt.Sprintf("d%d", i)))
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for j := range 2000 {
				i := (g*7 + j) % 20
				_, err := s.Lookup(fmt.Sprintf("d%d", i), objs[i], "f")
				if err != nil {
					return // closed
				}
			}
		})
	}
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, s.Close())
	wg.Wait()
	assert.Zero(t, openUnder(t, s.lower), "descriptors left open after Close")
}

// readObj reads the file p whose lookup gave o.
func (s *stack) readObj(p string, o Obj) string {
	fd, _, err := s.Open(p, &o, unix.O_RDONLY, s.c)
	require.NoError(s.t, err)
	defer unix.Close(fd)
	buf := make([]byte, 1<<16)
	n, err := unix.Read(fd, buf)
	require.NoError(s.t, err)
	return string(buf[:n])
}

// TestHeldLowerDirsBudget: the stacks of one process hold no more
// descriptors together than the budget (an eighth of the descriptor
// limit; 3 here), and a read past it still works, on its own descriptor.
func TestHeldLowerDirsBudget(t *testing.T) {
	saved := heldBudget
	heldBudget = func() int64 { return 3 }
	defer func() { heldBudget = saved }()
	files := map[string]string{}
	for i := range 6 {
		files[fmt.Sprintf("d%d/f", i)] = "x"
	}
	a, b := newStack(t, files), newStack(t, files)
	a.HoldLowerDirs(time.Hour)
	b.HoldLowerDirs(time.Hour)
	for i := range 6 {
		for _, s := range []*stack{a, b} {
			assert.Equal(t, "x", s.read(fmt.Sprintf("d%d/f", i)))
			assert.LessOrEqual(t, heldOpen.Load(), int64(3))
		}
	}
	assert.LessOrEqual(t, openUnder(t, a.lower)+openUnder(t, b.lower), 2+3, "the layers' roots and at most 3 held")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	assert.Zero(t, heldOpen.Load(), "every held descriptor closed and counted out")
}
