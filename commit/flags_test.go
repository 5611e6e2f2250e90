package commit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// chattr changes the inode flags of p in the sandbox as chattr does
// through a mount: it reads them, then sets them with set added and clear
// taken away.
func (s *sandbox) chattr(p string, set, clear uint32) error {
	o := s.lookup(p)
	cur, err := s.l.Flags(p, o, -1)
	require.NoError(s.t, err)
	return s.l.SetFlags(p, &o, -1, cur&^clear|set, s.c)
}

func carried(t *testing.T, p string) uint32 {
	t.Helper()
	return flagsOf(t, p) & fsutil.CarriedFlags
}

// TestCommitAppliesFlagChanges: chattr in the sandbox of an original file,
// a directory and the root is a metadata change each, and the commit
// gives the original exactly the flags set and taken away (a flag the
// sandbox did not touch stays); immutable is refused in the sandbox
// (EOPNOTSUPP, nothing recorded).
func TestCommitAppliesFlagChanges(t *testing.T) {
	s := newSandbox(t, map[string]string{"f": "f", "d/g": "g", "plain": "p"})
	setFlags(t, filepath.Join(s.orig, "f"), fsutil.FlagSync|fsutil.FlagNoDump)
	require.NoError(t, s.chattr("f", fsutil.FlagNoAtime, fsutil.FlagSync))
	require.NoError(t, s.chattr("d", fsutil.FlagDirSync, 0))
	require.NoError(t, s.chattr("", fsutil.FlagNoDump, 0))
	const immutable = 0x10
	assert.ErrorIs(t, s.chattr("plain", immutable, 0), unix.EOPNOTSUPP)
	require.NoError(t, s.chattr("plain", 0, 0), "no change: nothing to do")

	cs, err := s.l.Changes()
	require.NoError(t, err)
	var got []string
	for _, c := range cs.Changes {
		got = append(got, string(c.Kind)+" "+c.Path)
	}
	assert.ElementsMatch(t, []string{"metadata ", "metadata d", "metadata f"}, got)

	s.done()
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	assert.Equal(t, fsutil.FlagNoAtime|fsutil.FlagNoDump, carried(t, filepath.Join(s.orig, "f")), "f: +A -S, d kept")
	assert.Equal(t, fsutil.FlagDirSync, carried(t, filepath.Join(s.orig, "d")), "d: +D")
	assert.Equal(t, fsutil.FlagNoDump, carried(t, s.orig), "the root: +d")
	assert.Zero(t, carried(t, filepath.Join(s.orig, "plain")))
}

// TestFlagChangeUndone: a commit that gave a file the sandbox's flags is
// undone (after a conflict in the same process, or by the recovery after
// a crash): the file gets its flags back, unless another process changed
// them after the step, whose change then stays.
func TestFlagChangeUndone(t *testing.T) {
	for _, how := range []string{"undo", "recovery", "changed since"} {
		t.Run(how, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"f": "f", "g": "g"})
			p := filepath.Join(s.orig, "f")
			setFlags(t, p, fsutil.FlagNoDump)
			require.NoError(t, s.chattr("f", fsutil.FlagNoAtime, fsutil.FlagNoDump))
			s.write("g", "sandbox g")
			s.done()
			fd, err := unix.Open(filepath.Join(s.orig, "g"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
			require.NoError(t, err)
			defer unix.Close(fd)
			x, err := Prepare(s.cfg, Options{Fault: func(point string) {
				if point != "applied" {
					return
				}
				require.Equal(t, fsutil.FlagNoAtime, carried(t, p), "the apply set the sandbox's flags")
				if how == "changed since" {
					setFlags(t, p, fsutil.FlagSync)
				}
				_, err := unix.Pwrite(fd, []byte("G"), 0) // a conflict: the commit is undone
				require.NoError(t, err)
			}})
			require.NoError(t, err)
			if how == "recovery" {
				require.NoError(t, x.Apply())
				x.Close() // as a crash would leave it
				r, err := Recover(s.cfg, RecoverOptions{})
				require.NoError(t, err)
				assert.Equal(t, "undone", r.Action)
			} else {
				assertChangedDuringCommit(t, Commit(x), "g", changedDuringCommit)
			}
			want := fsutil.FlagNoDump
			if how == "changed since" {
				want = fsutil.FlagNoAtime | fsutil.FlagSync
			}
			assert.Equal(t, want, carried(t, p))
		})
	}
}

// TestFlagChangeRefusedOnAnUpperWithoutFlags: with the upper on a tmpfs,
// which keeps neither S nor D, a copy-up loses those of an original file;
// so the sandbox refuses every flag change there (EOPNOTSUPP), and a
// commit of the file's other changes leaves the original's flags as they
// are rather than take away what the copy lost.
func TestFlagChangeRefusedOnAnUpperWithoutFlags(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir, box := t.TempDir(), t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", box, "tmpfs", 0, "size=4m"))
	t.Cleanup(func() { _ = unix.Unmount(box, unix.MNT_DETACH) })
	s := newSandboxIn(t, dir, box, map[string]string{"f": "f"})
	p := filepath.Join(s.orig, "f")
	setFlags(t, p, fsutil.FlagSync|fsutil.FlagNoAtime)
	assert.ErrorIs(t, s.chattr("f", fsutil.FlagNoDump, 0), unix.EOPNOTSUPP)
	s.chmod("f", 0o600)
	s.done()
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	st, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Equal(t, fsutil.FlagSync|fsutil.FlagNoAtime, carried(t, p), "the original's flags, S with them")
}
