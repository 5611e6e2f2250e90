package layers

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

const (
	flagImmutable uint32 = 0x10 // FS_IMMUTABLE_FL
	flagAppend    uint32 = 0x20 // FS_APPEND_FL
)

// protect gives the original object p the flag f (chattr +i or +a) and
// takes it away when the test ends, so that the tree can be removed.
func protect(t *testing.T, p string, f uint32) {
	t.Helper()
	fd, err := fsutil.OpenForFlags(unix.AT_FDCWD, p)
	require.NoError(t, err)
	defer unix.Close(fd)
	base, err := fsutil.Flags(fd)
	if fsutil.NoFlags(err) {
		t.Skipf("%s keeps no inode flags", p)
	}
	require.NoError(t, err)
	if err := fsutil.SetFlags(fd, base|f); err != nil {
		t.Skipf("chattr needs CAP_LINUX_IMMUTABLE: %v", err)
	}
	t.Cleanup(func() {
		fd, err := fsutil.OpenForFlags(unix.AT_FDCWD, p)
		if err == nil {
			_ = fsutil.SetFlags(fd, base)
			unix.Close(fd)
		}
	})
}

// TestProtectedOriginalsRefuseChanges: what an immutable or append-only
// flag of an original object forbids, the sandbox refuses with EPERM
// before it changes anything (a commit could not apply it): changes of
// the object, its removal and renaming, a link to it; entries added to
// an immutable directory, removed from either kind, and a change of the
// content of a file in one. What the commit can apply stays allowed: a
// new entry in an append-only directory, a change of the attributes of a
// file in a protected directory (its content stays unchangeable after
// it, also for a new lookup), a change beneath a protected directory's
// subdirectory (which copies the protected directory up as a parent: the
// copy keeps the protection, also for a later lookup of it).
func TestProtectedOriginalsRefuseChanges(t *testing.T) {
	s := newStack(t, map[string]string{
		"i": "I", "a": "A", "plain": "P",
		"I/x": "X", "I/sub/z": "Z", "A/y": "Y",
	})
	protect(t, filepath.Join(s.lower, "i"), flagImmutable)
	protect(t, filepath.Join(s.lower, "a"), flagAppend)
	protect(t, filepath.Join(s.lower, "I"), flagImmutable)
	protect(t, filepath.Join(s.lower, "A"), flagAppend)
	root := s.dir("")
	eperm := func(what string, err error) {
		t.Helper()
		assert.ErrorIs(t, err, unix.EPERM, what)
	}
	for _, p := range []string{"i", "a", "I/x", "A/y"} {
		e, err := s.lookup(p)
		require.NoError(t, err)
		for _, flags := range []int{unix.O_WRONLY, unix.O_WRONLY | unix.O_APPEND, unix.O_RDONLY | unix.O_TRUNC} {
			o := e.Obj
			_, _, err := s.Open(p, &o, flags, s.c)
			eperm(p+": open for writing", err)
		}
		mode := uint32(0o600)
		o := e.Obj
		_, err = s.Setattr(p, &o, -1, SetAttr{Mode: &mode}, s.c)
		setx := s.Setxattr(p, &o, "user.x", []byte("v"), 0, s.c)
		if p == "i" || p == "a" {
			eperm(p+": chmod", err)
			eperm(p+": setxattr", setx)
		} else {
			// A file in a protected directory: its attributes change
			// (the commit sets them in place), its content still not.
			require.NoError(t, err, p+": chmod")
			require.NoError(t, setx, p+": setxattr")
			again, err := s.lookup(p)
			require.NoError(t, err)
			for _, obj := range []Obj{o, again.Obj} {
				_, _, err := s.Open(p, &obj, unix.O_WRONLY, s.c)
				eperm(p+": open for writing after a chmod", err)
				size := uint64(0)
				_, err = s.Setattr(p, &obj, -1, SetAttr{Size: &size}, s.c)
				eperm(p+": truncate after a chmod", err)
				_, err = s.Link(p, &obj, "", root, "link", s.c)
				eperm(p+": link after a chmod", err)
			}
			st, err := s.Stat(p, again.Obj)
			require.NoError(t, err)
			assert.EqualValues(t, 0o600, st.Mode&0o7777, p+": the chmod shows")
		}
		d, n := filepath.Split(p)
		d = filepath.Clean(d)
		if d == "." {
			d = ""
		}
		eperm(p+": unlink", s.Unlink(d, s.dir(d), n, s.c))
		eperm(p+": rename", s.Rename(d, s.dir(d), n, &o, "", root, "moved", 0, s.c))
		r, err := os.ReadFile(filepath.Join(s.lower, p))
		require.NoError(t, err)
		assert.Equal(t, string(r), s.read(p), "%s: unchanged", p)
	}
	for _, p := range []string{"i", "a"} {
		e, err := s.lookup(p)
		require.NoError(t, err)
		_, err = s.Link(p, &e.Obj, "", root, "link-"+p, s.c)
		eperm(p+": link", err)
	}
	_, _, err := s.Create("I", s.dir("I"), "new", 0o644, s.c)
	eperm("create in I", err)
	_, err = s.Mkdir("I", s.dir("I"), "newdir", 0o755, s.c)
	eperm("mkdir in I", err)
	plain := s.dir("plain")
	eperm("rename into I", s.Rename("", root, "plain", &plain, "I", s.dir("I"), "plain", 0, s.c))
	eperm("rmdir I", s.Rmdir("", root, "I", s.c))
	mode := uint32(0o700)
	dirI := s.dir("I")
	_, err = s.Setattr("I", &dirI, -1, SetAttr{Mode: &mode}, s.c)
	eperm("chmod I", err)

	// Allowed: a file made in A; a change beneath I/sub.
	fd, _, err := s.Create("A", s.dir("A"), "new", 0o644, s.c)
	require.NoError(t, err, "a new entry in an append-only directory")
	unix.Close(fd)
	s.write("I/sub/z", "changed")
	assert.Equal(t, "changed", s.read("I/sub/z"))
	assert.True(t, s.inUpper("I"), "I copied up as a parent")

	// The copy of I keeps I's protection, for a stack opened again too.
	require.NoError(t, s.Close())
	l, err := Open(Config{Upper: filepath.Dir(s.UpperPath("")) + "/upper", Work: s.work, Lowers: []string{s.lower}})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	s.Layers = l
	_, _, err = s.Create("I", s.dir("I"), "new", 0o644, s.c)
	eperm("create in I, copied up", err)
	e, err := s.lookup("I/x")
	require.NoError(t, err)
	_, _, err = s.Open("I/x", &e.Obj, unix.O_WRONLY, s.c)
	eperm("write I/x, I copied up", err)
}

// TestListingOfRemovalsThatFailed: the removal of an immutable file is
// refused after its record (the journal records an operation before it
// makes it), so the record alone does not say the object went: the
// listing names nothing of it, also once its directory moved. Caught by
// TestProtectedOriginalsThroughAMount when the listing first named the
// earlier removals at a path (TestChangeSetTwoRemovalsAtOnePath).
func TestListingOfRemovalsThatFailed(t *testing.T) {
	s := newStack(t, map[string]string{"i": "I", "d/i": "X", "d/keep": "K"})
	protect(t, filepath.Join(s.lower, "i"), flagImmutable)
	protect(t, filepath.Join(s.lower, "d/i"), flagImmutable)
	assert.ErrorIs(t, s.Unlink("", s.dir(""), "i", s.c), unix.EPERM)
	assert.ErrorIs(t, s.Unlink("d", s.dir("d"), "i", s.c), unix.EPERM)
	var o Obj
	require.NoError(t, s.Rename("", s.dir(""), "d", &o, "", s.dir(""), "e", 0, s.c))
	assert.Equal(t, []string{"renamed e"}, s.listingLines())
}
