package layers

import (
	"fmt"
	"maps"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// randomJournal makes a journal of up to n records over a small
// namespace: creates, writes, removals, links, renames of files and
// directories (over each other, exchanged), attribute changes with and
// without times, and base records (several for one path, some
// unreadable).
func randomJournal(rng *rand.Rand, n int) []Record {
	return genRecords(rng, n, []string{"", "a", "b", "c", "a/b", "a/c", "b/a", "a/b/c", "c/a/b", "d", "d/e"},
		[]Op{OpCreate, OpMkdir, OpWrite, OpUnlink, OpRmdir, OpLink, OpRename, OpRename, OpRename, OpSetattr, OpSetxattr, OpBase, OpTruncate})
}

// genRecords draws tries records of ops over names, leaving out the
// renames and links the kernel refuses.
func genRecords(rng *rand.Rand, tries int, names []string, ops []Op) []Record {
	var recs []Record
	for i := range tries {
		r := Record{Op: ops[rng.Intn(len(ops))], Path: names[rng.Intn(len(names))], Time: time.Unix(int64(i), 0).UTC()}
		switch r.Op {
		case OpRename:
			r.Path2 = names[rng.Intn(len(names))]
			if rng.Intn(4) == 0 {
				r.Flags = unix.RENAME_EXCHANGE
			}
		case OpLink:
			r.Path2 = names[rng.Intn(len(names))]
		case OpSetattr:
			r.Flags = uint32(rng.Intn(2)) * AttrTimes
		case OpBase:
			r.Path2 = Signature{Ino: uint64(rng.Intn(1000)), Mode: unix.S_IFREG | 0o644, Size: int64(rng.Intn(100))}.String()
			if rng.Intn(5) == 0 {
				r.Path2 = "not a signature"
			}
		}
		if (r.Op == OpRename || r.Op == OpLink) && (r.Path == "" || r.Path2 == "" || r.Path == r.Path2 ||
			strings.HasPrefix(r.Path2, r.Path+"/") || strings.HasPrefix(r.Path, r.Path2+"/")) {
			continue // the kernel refuses these
		}
		recs = append(recs, r)
	}
	return recs
}

// replayState is what a change set is read from: touched's maps, with
// linkRev without its emptied sets.
func replayState(t *touched) string {
	rev := map[string][]string{}
	for v, ks := range t.linkRev {
		if len(ks) > 0 {
			rev[v] = slices.Sorted(maps.Keys(ks))
		}
	}
	removedAs := map[string][]string{} // in the order recorded, unless moved together
	for p, qs := range t.removedAs {
		removedAs[p] = slices.Sorted(slices.Values(qs))
	}
	return fmt.Sprintf("paths %v\ntimes %v\nmade %v\nfresh %v\ndead %v\nfrom %q\nlink %v\nlinkRev %v\nseen %v\nremovedHere %v\nremovedAs %q",
		t.paths, t.times, t.made, t.fresh, t.dead, t.from, t.link, rev, t.seen, t.removedHere, removedAs)
}

// compacted returns recs in their compacted form.
func compacted(t *testing.T, recs []Record) []Record {
	t.Helper()
	in := versionHeader(compactedVersion) // recs may hold keep records
	for i := range recs {
		in = appendRecord(in, &recs[i])
	}
	body, _, ok, err := compactRecords(in, time.Unix(0, 0), nil)
	require.NoError(t, err)
	require.True(t, ok, "the journal could be compacted")
	out, valid, err := DecodeJournal(append(versionHeader(compactedVersion), body...))
	require.NoError(t, err)
	require.Equal(t, journalHeaderLen+len(body), valid)
	return out
}

// TestCompactedJournalReplaysTheSame: a random journal compacted at a
// random point, with the records after that point appended to the
// compacted form, replays to the same state as the whole journal (every
// map the change set is read from, the bases included), also compacted
// twice. (A short journal may compact to more records: a rename touches
// two paths; the journal is then left as it is.)
func TestCompactedJournalReplaysTheSame(t *testing.T) {
	t.Parallel()
	for seed := int64(1); seed <= 2000; seed++ {
		rng := rand.New(rand.NewSource(seed))
		recs := randomJournal(rng, 1+rng.Intn(60))
		k := rng.Intn(len(recs) + 1)
		want := replayState(replay(recs))

		once := append(compacted(t, recs[:k]), recs[k:]...)
		if got := replayState(replay(once)); got != want {
			t.Fatalf("seed %d, compacted after %d of %d records:\n%v\ngot:\n%s\nwant:\n%s", seed, k, len(recs), recs, got, want)
		}
		assert.Equal(t, Bases(recs), Bases(once), "seed %d: bases", seed)
		twice := compacted(t, once)
		if got := replayState(replay(twice)); got != want {
			t.Fatalf("seed %d, compacted twice:\n%v\ngot:\n%s\nwant:\n%s", seed, recs, got, want)
		}
		require.NoError(t, checkPaths(twice), "seed %d", seed)
	}
}

// TestCompactionBoundsTheJournal: a journal that records the same
// thousand files rewritten again and again is compacted as it grows, in
// the background, while readers read it as another process would; it
// stays under a quarter of the size of all its records, every read of it
// replays to the state of some prefix of what was appended (nothing lost,
// nothing doubled, never damaged), and it replays in the end to the state
// of all of it: once compacted at the end, in about a record a path. It stays
// locked throughout, and opens again.
func TestCompactionBoundsTheJournal(t *testing.T) {
	t.Parallel()
	j, path := newJournal(t)
	j.floor, j.ratio = 32<<10, 1
	var results []CompactResult
	var mu sync.Mutex
	j.OnCompact(func(r CompactResult) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
	})

	// Records: writes and attribute changes of the same thousand files,
	// and one in 100 a new file n0, n1, ... (so that a prefix can be told
	// by them).
	var all []Record
	stop := make(chan struct{})
	var reads atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				recs, err := ReadJournal(path)
				if !assert.NoError(t, err) {
					return
				}
				var made []string
				for p := range replay(recs).made {
					made = append(made, p)
				}
				for i := range len(made) {
					if !assert.Contains(t, made, fmt.Sprintf("n%06d", i), "a read holds n0 to n%d without a gap", len(made)-1) {
						return
					}
				}
				reads.Add(1)
			}
		})
	}
	var largest int64
	for i := range 100_000 {
		r := Record{Op: OpWrite, Path: fmt.Sprintf("same/f%03d", i%1000)}
		switch {
		case i%100 == 0:
			r = Record{Op: OpCreate, Path: fmt.Sprintf("n%06d", i/100)}
		case i%4 == 1:
			r = Record{Op: OpSetattr, Path: r.Path, Flags: AttrTimes}
		}
		require.NoError(t, j.Append(r))
		all = append(all, r)
		if i%500 == 0 {
			require.NoError(t, j.Sync())
		}
		var st unix.Stat_t
		require.NoError(t, unix.Stat(path, &st))
		largest = max(largest, st.Size)
	}
	close(stop)
	wg.Wait()
	j.compacts.Wait()
	_, after, _, err := j.compactOnce() // once more, for a journal of about the state alone
	require.NoError(t, err)
	_, err = OpenJournal(path)
	assert.ErrorIs(t, err, unix.EWOULDBLOCK, "the compacted journal is locked")
	require.NoError(t, j.Close())

	mu.Lock()
	require.NotEmpty(t, results, "compactions reported")
	for _, r := range results {
		require.NoError(t, r.Err)
	}
	rewrites := 0
	for _, r := range results {
		if r.After < r.Before {
			rewrites++
		}
	}
	mu.Unlock()
	assert.Greater(t, rewrites, 2, "the journal was rewritten several times")
	full := int64(len(encodeJournal(all)))
	assert.Less(t, largest, full/4, "the journal stayed within a quarter of all its records (%d bytes)", full)
	assert.Positive(t, reads.Load())

	got, err := ReadJournal(path)
	require.NoError(t, err)
	assert.Equal(t, replayState(replay(all)), replayState(replay(got)), "the compacted journal replays to the same state")
	// A rewrite that would not save a quarter is not made.
	assert.LessOrEqual(t, len(got), len(compacted(t, all))*4/3, "about a record a path")
	assert.Less(t, after, full/20)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, versionHeader(compactedVersion), data[:journalHeaderLen], "a compacted journal says so in its version")

	j2, err := OpenJournal(path)
	require.NoError(t, err)
	require.NoError(t, j2.Append(Record{Op: OpUnlink, Path: "n000000"}))
	require.NoError(t, j2.Close())
	got, err = ReadJournal(path)
	require.NoError(t, err)
	assert.Equal(t, replayState(replay(append(all, Record{Op: OpUnlink, Path: "n000000"}))), replayState(replay(got)))
}

// TestCompactionNotWorthItLeavesTheJournal: a journal of distinct paths,
// one record each, has nothing to drop: it stays as written, version 1.
func TestCompactionNotWorthItLeavesTheJournal(t *testing.T) {
	t.Parallel()
	j, path := newJournal(t)
	j.floor, j.ratio = 4<<10, 1
	done := make(chan CompactResult, 100)
	j.OnCompact(func(r CompactResult) { done <- r })
	var all []Record
	for i := 0; i < 1000 || len(done) == 0; i++ {
		r := Record{Op: OpCreate, Path: fmt.Sprintf("dir/file-%06d", i)}
		require.NoError(t, j.Append(r))
		all = append(all, r)
		if i > 1000 {
			time.Sleep(time.Millisecond) // for the compaction to report
		}
		require.Less(t, i, 10_000, "no compaction was tried")
	}
	require.NoError(t, j.Close())
	close(done)
	for r := range done {
		require.NoError(t, r.Err)
		assert.Equal(t, r.Before, r.After, "nothing rewritten")
	}
	got, err := ReadJournal(path)
	require.NoError(t, err)
	require.Len(t, got, len(all))
	for i := range got {
		require.Equal(t, all[i].Path, got[i].Path)
		require.Equal(t, all[i].Op, got[i].Op)
	}
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, journalHeader(), data[:journalHeaderLen])
}

// TestCompactionAtClose: Close waits for a compaction under way, which
// then leaves the journal (and no file beside it); a compaction that a
// crash interrupted leaves a file beside the journal, which the next
// OpenJournal removes.
func TestCompactionAtClose(t *testing.T) {
	t.Parallel()
	for range 20 {
		j, path := newJournal(t)
		j.floor, j.ratio = 1, 0 // after every append
		var all []Record
		for i := range 300 {
			r := Record{Op: OpWrite, Path: fmt.Sprintf("f%d", i%7)}
			require.NoError(t, j.Append(r))
			all = append(all, r)
		}
		require.NoError(t, j.Close())
		_, err := os.Lstat(path + compactSuffix)
		assert.ErrorIs(t, err, os.ErrNotExist, "no compaction left beside the journal")
		got, err := ReadJournal(path)
		require.NoError(t, err)
		assert.Equal(t, replayState(replay(all)), replayState(replay(got)))
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "journal")
	require.NoError(t, os.WriteFile(path, encodeJournal(oddRecords()), 0o600))
	require.NoError(t, os.WriteFile(path+compactSuffix, []byte("half a compaction"), 0o600))
	j, err := OpenJournal(path)
	require.NoError(t, err)
	defer j.Close()
	_, err = os.Lstat(path + compactSuffix)
	assert.ErrorIs(t, err, os.ErrNotExist, "the unfinished compaction removed")
	assert.Equal(t, oddRecords(), records(t, j))
}

// TestOpenJournalLockedAReplacedFile: a file the open locked after a
// compaction renamed a new journal over it is not the journal.
func TestOpenJournalLockedAReplacedFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "journal")
	require.NoError(t, os.WriteFile(path, encodeJournal(oddRecords()), 0o600))
	fd, err := unix.Open(path, journalOpenFlags, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, os.WriteFile(path+".new", encodeJournal(oddRecords()[:3]), 0o600))
	require.NoError(t, os.Rename(path+".new", path))
	j := &Journal{path: path, fd: fd}
	assert.ErrorIs(t, j.load(), errReplaced)
}

// TestCompactionFailureBacksOff: a compaction that fails (here its file
// cannot be made) leaves the journal whole, is reported, and is not tried
// again at every append, only once the journal has grown as much again.
func TestCompactionFailureBacksOff(t *testing.T) {
	t.Parallel()
	j, path := newJournal(t)
	j.floor, j.ratio = 4<<10, 1
	require.NoError(t, os.Mkdir(path+compactSuffix, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(path+compactSuffix, "x"), nil, 0o600)) // not removable by unlink
	var failed atomic.Int64
	j.OnCompact(func(r CompactResult) {
		if r.Err != nil {
			failed.Add(1)
		}
	})
	var all []Record
	for i := range 5000 {
		r := Record{Op: OpWrite, Path: fmt.Sprintf("f%d", i%10)}
		require.NoError(t, j.Append(r))
		all = append(all, r)
		if i%100 == 0 {
			j.compacts.Wait() // let each compaction end before more appends
		}
	}
	require.NoError(t, j.Close())
	assert.Positive(t, failed.Load(), "the failures were reported")
	assert.Less(t, failed.Load(), int64(10), "tried when the journal doubled, not at every append")
	got, err := ReadJournal(path)
	require.NoError(t, err)
	assert.Equal(t, replayState(replay(all)), replayState(replay(got)))
	require.Len(t, got, len(all), "the journal as appended")
}
