package layers

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// TestServerMark: a stack opened for serving marks its journal (durably,
// before anything changes the upper) and a clean Close removes the mark;
// a mark whose process is gone on this boot, the journal reached through
// the same mount, says the process crashed (the journal is whole); of
// another boot, another mount, or not a mark at all, that records may
// have been lost.
func TestServerMark(t *testing.T) {
	s := newStack(t, map[string]string{"a": "A"})
	mark := s.journalPath + serverMarkSuffix
	st, err := os.Lstat(mark)
	require.NoError(t, err, "an open stack has a server mark")
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	stop, err := serverStop(mark, s.journalPath)
	require.NoError(t, err)
	assert.Equal(t, serving, stop, "the mark of this live process")

	other := filepath.Join(t.TempDir(), "mark")
	journal := other + ".journal"
	require.NoError(t, os.WriteFile(journal, nil, 0o600))
	mnt := mountID(journal)
	require.NotEqual(t, "-", mnt, "this kernel gives unique mount ids (Linux 6.8)")
	for _, c := range []struct {
		mark string
		stop lastStop
	}{
		{"v2 not-this-boot 1 1 " + mnt + "\n", lostRecords},
		{fmt.Sprintf("v2 %s %d 1 %s\n", bootID(), os.Getpid(), mnt), crashed}, // this pid, another start time
		{fmt.Sprintf("v2 %s 1 1 %s\n", bootID(), mnt), crashed},
		{fmt.Sprintf("v2 %s 1 1 1%s\n", bootID(), mnt), lostRecords}, // another mount
		{fmt.Sprintf("v2 %s 1 1 -\n", bootID()), lostRecords},
		{fmt.Sprintf("v1 %s 1 1\n", bootID()), lostRecords},
		{"", lostRecords},
		{"garbage", lostRecords},
	} {
		require.NoError(t, os.WriteFile(other, []byte(c.mark), 0o600))
		stop, err := serverStop(other, journal)
		require.NoError(t, err)
		assert.Equal(t, c.stop, stop, "mark %q", c.mark)
	}
	// A server in another pid namespace: its pid names nothing here, its
	// lock on the journal says it serves.
	f, err := os.OpenFile(journal, os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, fsutil.HoldLock(int(f.Fd())))
	require.NoError(t, os.WriteFile(other, []byte("v1 "+bootID()+" 1 1\n"), 0o600))
	stop, err = serverStop(other, journal)
	require.NoError(t, err)
	assert.Equal(t, serving, stop, "a server holding the journal's lock")
	f.Close()
	stop, err = serverStop(other, journal)
	require.NoError(t, err)
	assert.Equal(t, lostRecords, stop, "the lock let go")

	require.NoError(t, os.Remove(other))
	stop, err = serverStop(other, journal)
	require.NoError(t, err)
	assert.Equal(t, stoppedCleanly, stop, "no mark: a clean stop")

	require.NoError(t, s.Close())
	_, err = os.Lstat(mark)
	assert.True(t, os.IsNotExist(err), "a clean Close removes the mark: %v", err)
}

// TestServerMarkAfterJournalDoubt (found by a review on 2026-11-28): once
// the journal's error is sticky (a failed fdatasync may have dropped
// records' pages, with no remount to show it), the mark no longer names
// the journal's mount, so that a crash of the server afterwards is taken
// for a loss of records, and the close, which fails, leaves it.
func TestServerMarkAfterJournalDoubt(t *testing.T) {
	s := newStack(t, map[string]string{"a": "A"})
	mark := s.journalPath + serverMarkSuffix
	j := s.Journal()
	j.mu.Lock()
	j.setErr(errors.New("fdatasync: input/output error (injected)"))
	j.mu.Unlock()
	b, err := os.ReadFile(mark)
	require.NoError(t, err)
	f := strings.Fields(string(b))
	require.Len(t, f, 5)
	assert.Equal(t, "-", f[4], "the mark names no mount once the journal is in doubt")
	require.Error(t, s.Close())
	// The server's process gone (pid 1, another start time): a loss.
	f[2], f[3] = "1", "1"
	require.NoError(t, os.WriteFile(mark, []byte(strings.Join(f, " ")+"\n"), 0o600))
	stop, err := serverStop(mark, s.journalPath)
	require.NoError(t, err)
	assert.Equal(t, lostRecords, stop)
}

// TestServerMarkFromAnotherPidNamespace: a reader in a pid namespace of
// its own (a container's `sbxfs status` of a sandbox served outside it)
// finds neither the server's pid nor, in /proc/locks, its flock (the
// kernel hides a lock whose holder's pid the reader's namespace does not
// see): the journal's open file description lock still says the server
// is alive, so the reader does not take a live sandbox for one whose
// server stopped uncleanly.
func TestServerMarkFromAnotherPidNamespace(t *testing.T) {
	const env = "SBXFS_TEST_MARK_PROBE"
	if spec := os.Getenv(env); spec != "" {
		var mark, journal string
		_, err := fmt.Sscanf(spec, "%q %q", &mark, &journal)
		require.NoError(t, err)
		stop, err := serverStop(mark, journal)
		require.NoError(t, err)
		fmt.Printf("probe: serving=%v\n", stop == serving)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("unshare --pid needs root")
	}
	s := newStack(t, map[string]string{"a": "A"})
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount", "--mount-proc", os.Args[0],
		"-test.run", "^TestServerMarkFromAnotherPidNamespace$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%q %q", env, s.journalPath+serverMarkSuffix, s.journalPath))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "probe: serving=true", "the reader in its own pid namespace sees the server alive")
}

// TestRecordsAfterAnUncleanStop: the journal lost its tail (cut back to
// its header) while the upper kept a renamed directory, a removal, a
// written original and a new file. Records adds what names them, without
// writing the journal; the change set read from them is the one the
// whole journal gave; Open writes them, and a clean Close leaves a
// journal Records reads as it is.
func TestRecordsAfterAnUncleanStop(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	for _, d := range []string{cfg.Upper, cfg.Work} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	writeTree(t, cfg.Lowers[0], map[string]string{"d/x": "x", "gone": "g", "edit": "e", "keep": "k"})
	l, err := Open(cfg)
	require.NoError(t, err)
	s := &stack{Layers: l, t: t, lower: cfg.Lowers[0], c: Caller{Pid: 1}}
	header, err := os.Stat(cfg.journalPath())
	require.NoError(t, err)
	root := s.dir("")
	require.NoError(t, s.Rename("", root, "d", ptr(s.dir("d")), "", root, "moved", 0, s.c))
	require.NoError(t, s.Unlink("", s.dir(""), "gone", s.c))
	s.write("edit", "edited")
	s.createEmpty("", "new")
	want := s.changeLines()
	require.Contains(t, want, "renamed moved d")

	// The power cut: the server gone without closing the journal, whose
	// records since its header are lost.
	require.NoError(t, l.Journal().Close())
	require.NoError(t, os.Truncate(cfg.journalPath(), header.Size()))
	require.NoError(t, os.WriteFile(cfg.journalPath()+serverMarkSuffix, []byte("v1 the-boot-before 1234 5678\n"), 0o600))
	recs, err := Records(cfg)
	require.NoError(t, err)
	assert.NotEmpty(t, recs, "records naming what the upper holds")
	after, err := os.Stat(cfg.journalPath())
	require.NoError(t, err)
	assert.Equal(t, header.Size(), after.Size(), "a reader writes nothing")
	cs, err := Changes(cfg)
	require.NoError(t, err)
	assert.Equal(t, want, lines(cs))

	l2, err := Open(cfg)
	require.NoError(t, err)
	assert.Equal(t, len(recs)-1, l2.Reconciled()) // all but the root's base
	require.NoError(t, l2.Close())
	written, err := ReadJournal(cfg.journalPath())
	require.NoError(t, err)
	again, err := Records(cfg)
	require.NoError(t, err)
	assert.Equal(t, len(written), len(again), "after a clean stop the journal is read as it is")
	cs, err = Changes(cfg)
	require.NoError(t, err)
	assert.Equal(t, want, lines(cs))
}

func ptr[T any](v T) *T { return &v }

// lines is a change set as changeLines gives it.
func lines(cs ChangeSet) []string {
	var out []string
	for _, c := range cs.Changes {
		out = append(out, string(c.Kind)+" "+c.Path+" "+c.From)
	}
	return out
}

// BenchmarkReconcile: the walk after an unclean stop of an upper holding
// 10,000 new files in 100 directories and 1,000 copied-up originals,
// whose journal lost everything (each op reconciles from the header).
func BenchmarkReconcile(b *testing.B) {
	t := &testing.T{}
	files := map[string]string{}
	for i := 0; i < 1000; i++ {
		files[fmt.Sprintf("o%d/f%d", i%10, i)] = "original"
	}
	dir := b.TempDir()
	cfg := Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	for _, d := range []string{cfg.Upper, cfg.Work, cfg.Lowers[0]} {
		require.NoError(b, os.MkdirAll(d, 0o755))
	}
	writeTree(t, cfg.Lowers[0], files)
	l, err := Open(cfg)
	require.NoError(b, err)
	defer l.Close()
	s := &stack{Layers: l, t: t, lower: cfg.Lowers[0], c: Caller{Pid: 1}}
	for d := 0; d < 100; d++ {
		_, err := s.Mkdir("", s.dir(""), fmt.Sprintf("n%d", d), 0o755, s.c)
		require.NoError(b, err)
		for i := 0; i < 100; i++ {
			s.createEmpty(fmt.Sprintf("n%d", d), fmt.Sprintf("f%d", i))
		}
	}
	for p := range files {
		s.write(p, "changed")
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		recs, err := l.reconcile(nil)
		require.NoError(b, err)
		if i == 0 {
			b.ReportMetric(float64(len(recs)), "records")
		}
	}
}

// TestBaseRecordedWhenARemovalIsTriedAgain (found by a review on
// 2026-11-28): an unlink whose base record found no room in the journal
// (its own record did) fails; tried again, it records the base. It was
// taken for recorded, and the removal went ahead without one: a commit
// does not check a removal without a base, and removed the original's
// file whatever another writer had made of it. The room runs out by
// RLIMIT_FSIZE (write fails with EFBIG; Go ignores SIGXFSZ), in a process
// of its own: the limit is the whole process's.
func TestBaseRecordedWhenARemovalIsTriedAgain(t *testing.T) {
	const env = "SBXFS_TEST_FSIZE_CHILD"
	if os.Getenv(env) == "" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestBaseRecordedWhenARemovalIsTriedAgain$", "-test.v")
		cmd.Env = append(os.Environ(), env+"=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Contains(t, string(out), "--- PASS: TestBaseRecordedWhenARemovalIsTriedAgain", "the child ran the checks")
		return
	}
	s := newStack(t, map[string]string{"a": "A"})
	require.NoError(t, s.Journal().Sync())
	unlinkLen := len(appendRecord(nil, &Record{Op: OpUnlink, Path: "a"}))
	var st unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(s.lower, "a"), &st))
	baseLen := len(appendRecord(nil, &Record{Op: OpBase, Path: "a", Path2: SignatureOf(&st).String()}))
	s.Journal().mu.Lock()
	size := s.Journal().size
	s.Journal().mu.Unlock()

	var was unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_FSIZE, &was))
	lim := unix.Rlimit{Cur: uint64(size) + uint64(unlinkLen+baseLen) - 1, Max: was.Max}
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_FSIZE, &lim))
	root := s.dir("")
	c := Caller{Pid: 1}
	err := s.Unlink("", root, "a", c)
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_FSIZE, &was))
	require.ErrorIs(t, err, unix.EFBIG, "the base finds no room")
	require.NoError(t, s.Unlink("", root, "a", c), "tried again with room")
	recs, err := s.Journal().Records()
	require.NoError(t, err)
	_, based := Bases(recs)["a"]
	assert.True(t, based, "the removal of a has its base")
}
