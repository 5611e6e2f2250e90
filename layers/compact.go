package layers

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Journal compaction (docs/journal-format.md, "Compaction").
//
// A sandbox's journal grows with every operation, but the change set
// depends only on the state its replay ends in (touched): which paths
// were touched and how, where each came from, what was linked to what,
// and the first signature of each original path. A build that rewrites
// the same thousand files all day appends records without end for a
// state that stays the same size. Once the records appended since the
// journal was opened or last compacted pass a threshold, the serving
// process rewrites the journal as that state: the first base record of
// each original path, one keep record a touched path, one keeplink
// record a link. The new file is written beside the journal, the records
// appended meanwhile copied after, and renamed over it, so a reader in
// another process (status, commit) sees the old journal or the new one,
// each whole; the new one replays to the same change set.

// The flags of a keep record: what the replay held for its path.
const (
	keepTouched     = 1 << iota // in touched.paths
	keepContent                 // ... with a content op seen
	keepTimes                   // in touched.times
	keepMade                    // in touched.made
	keepFrom                    // touched.from holds Path2
	keepFromMade                // touched.from holds madeHere followed by Path2 (beneath an object the sandbox made)
	keepFresh                   // in touched.fresh
	keepDead                    // in touched.dead
	keepRemovedHere             // in touched.removedHere
	// keepRemovedAs: Path2 is in touched.removedAs of the path. In a
	// record without keepFrom and keepFromMade, else in one of its own
	// (one a removal past the first). A reader before it ignored it: its
	// listing missed those removals, as before it.
	keepRemovedAs
)

// compactSuffix names the file a compaction writes beside the journal.
const compactSuffix = ".compact"

// When a journal is compacted: once the bytes appended since it was
// opened or last compacted reach compactFloor and compactRatio times its
// size then. The ratio keeps the work of compacting in proportion to the
// appends (a journal whose state is large is compacted less often); the
// floor keeps small journals as they are (4 MiB: ~25,000 records, read
// for a status in ~40 ms; compacting 8 MiB took 80 ms). SBXFS_JOURNAL_COMPACT=N (bytes) compacts every
// N bytes appended, whatever the journal's size: for tests.
var (
	compactFloor int64 = 4 << 20
	compactRatio int64 = 3
)

func init() {
	if v := os.Getenv("SBXFS_JOURNAL_COMPACT"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
			compactFloor, compactRatio = n, 0
		}
	}
}

// CompactResult reports one compaction of a journal: its size before and
// after (equal when rewriting it would not have saved a quarter), and how
// long it took. Err is set when it failed; the journal is then as it was,
// unless Err says it is in doubt (as after a failed fdatasync).
type CompactResult struct {
	Before, After int64
	Took          time.Duration
	Err           error
	// Dropped counts the dead paths left out (dropDead).
	Dropped int
}

// restore replays a keep or keeplink record.
func (t *touched) restore(r *Record) {
	if r.Op == OpKeepLink {
		t.setLink(r.Path, r.Path2)
		return
	}
	p := r.Path
	t.index.add(p)
	if r.Flags&keepTouched != 0 {
		t.paths[p] = r.Flags&keepContent != 0
	}
	if r.Flags&keepTimes != 0 {
		t.times[p] = true
	}
	if r.Flags&keepMade != 0 {
		t.made[p] = true
	}
	if r.Flags&keepFresh != 0 {
		t.fresh[p] = true
	}
	if r.Flags&keepDead != 0 {
		t.dead[p] = true
	}
	if r.Flags&keepRemovedHere != 0 {
		t.removedHere[p] = true
	}
	if r.Flags&keepRemovedAs != 0 && !slices.Contains(t.removedAs[p], r.Path2) {
		t.removedAs[p] = append(t.removedAs[p], r.Path2)
	}
	switch {
	case r.Flags&keepFromMade != 0:
		t.from[p] = madeHere + r.Path2
	case r.Flags&keepFrom != 0:
		t.from[p] = r.Path2
	}
}

// snapshot returns the keep and keeplink records that replay to t's
// paths, times, made, fresh, dead, from, removedHere, removedAs and
// link, sorted by path. ok is false when t
// holds what a record cannot (a NUL in a path, a record over the size
// limit): such a journal is left as it is.
func (t *touched) snapshot(now time.Time) (recs []Record, ok bool) {
	keys := map[string]bool{}
	for _, m := range []map[string]bool{t.paths, t.times, t.made, t.fresh, t.dead} {
		for p := range m {
			keys[p] = true
		}
	}
	for p := range t.from {
		keys[p] = true
	}
	for p := range t.removedHere {
		keys[p] = true
	}
	for p := range t.removedAs {
		keys[p] = true
	}
	sorted := slices.Sorted(func(yield func(string) bool) {
		for p := range keys {
			if !yield(p) {
				return
			}
		}
	})
	for _, p := range sorted {
		r := Record{Op: OpKeep, Path: p, Time: now}
		if content, ok := t.paths[p]; ok {
			r.Flags |= keepTouched
			if content {
				r.Flags |= keepContent
			}
		}
		if t.times[p] {
			r.Flags |= keepTimes
		}
		if t.made[p] {
			r.Flags |= keepMade
		}
		if t.fresh[p] {
			r.Flags |= keepFresh
		}
		if t.dead[p] {
			r.Flags |= keepDead
		}
		if t.removedHere[p] {
			r.Flags |= keepRemovedHere
		}
		removedAs := t.removedAs[p]
		if f, ok := t.from[p]; ok {
			if rest, made := strings.CutPrefix(f, madeHere); made {
				r.Flags |= keepFromMade
				r.Path2 = rest
			} else {
				r.Flags |= keepFrom
				r.Path2 = f
			}
		} else if len(removedAs) > 0 {
			r.Flags |= keepRemovedAs
			r.Path2, removedAs = removedAs[0], removedAs[1:]
		}
		recs = append(recs, r)
		for _, q := range removedAs {
			recs = append(recs, Record{Op: OpKeep, Path: p, Path2: q, Flags: keepRemovedAs, Time: now})
		}
	}
	links := slices.Sorted(func(yield func(string) bool) {
		for k := range t.link {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range links {
		recs = append(recs, Record{Op: OpKeepLink, Path: k, Path2: t.link[k], Time: now})
	}
	for _, r := range recs {
		if strings.ContainsRune(r.Path, 0) || strings.ContainsRune(r.Path2, 0) ||
			recordFixedLen+len(r.Path)+len(r.Path2) > maxRecordPayload {
			return nil, false
		}
	}
	return recs, true
}

// dropDead takes out of t each dead path (touched.dead) that nothing
// else in t lies beneath and that gone confirms holds nothing in the
// upper: t is then as if no record had named it. The journal records a
// removal before it makes it, so a crash between the two leaves a dead
// path whose object is still there (or a whiteout, where the original
// gained an object at that path meanwhile): gone says no, and the path
// stays. A name linked to a dropped one loses that link, which told only
// that the two were one object while both were there. It returns how
// many it dropped. t's index is not updated: t is only snapshot after.
func (t *touched) dropDead(gone func(paths []string) []bool) (dropped int) {
	if gone == nil || len(t.dead) == 0 {
		return 0
	}
	holds := map[string]bool{} // directories above a path t keeps
	above := func(p string) {
		for {
			i := strings.LastIndexByte(p, '/')
			if i < 0 || holds[p[:i]] {
				return
			}
			p = p[:i]
			holds[p] = true
		}
	}
	for p := range t.paths {
		if !t.dead[p] {
			above(p)
		}
	}
	for p, v := range t.from {
		if !t.dead[p] || !madeLineage(v) {
			above(p)
		}
	}
	for k, v := range t.link {
		above(k)
		above(v)
	}
	var candidates []string
	for _, p := range slices.Sorted(maps.Keys(t.dead)) {
		if v, moved := t.from[p]; (!moved || madeLineage(v)) && !holds[p] {
			candidates = append(candidates, p)
		}
	}
	if len(candidates) == 0 {
		return 0
	}
	confirmed := gone(candidates)
	for i, p := range candidates {
		if i >= len(confirmed) || !confirmed[i] {
			continue
		}
		for _, m := range []map[string]bool{t.paths, t.times, t.made, t.fresh, t.dead, t.removedHere} {
			delete(m, p)
		}
		delete(t.from, p)
		delete(t.removedAs, p)
		if v, ok := t.link[p]; ok {
			delete(t.linkRev[v], p)
			delete(t.link, p)
		}
		for k := range t.linkRev[p] {
			delete(t.link, k)
		}
		delete(t.linkRev, p)
		dropped++
	}
	return dropped
}

// madeLineage reports whether a rename lineage (touched.from) leads to
// an object the sandbox made: no original counterpart, so a dead path
// with it, removed, named nothing of the original's.
func madeLineage(from string) bool {
	return strings.HasPrefix(from, madeHere)
}

// compactRecords returns the records of the compacted form of the
// journal data (a whole journal, header included), encoded, without a
// header, and how many dead paths it dropped (dropDead, with gone). ok is
// false when it cannot be compacted (snapshot) or data does not end with
// a whole record.
func compactRecords(data []byte, now time.Time, gone func([]string) []bool) (body []byte, dropped int, ok bool, err error) {
	t := newTouched()
	var bases []Record
	valid, err := eachRecord(data, func(r *Record) {
		if r.Op != OpBase {
			t.apply(r)
			return
		}
		if _, seen := t.seen[r.Path]; seen {
			return
		}
		t.apply(r)
		if _, seen := t.seen[r.Path]; seen {
			bases = append(bases, *r) // the base every reader takes (Bases)
		}
	})
	if err != nil || valid != len(data) {
		return nil, 0, false, err
	}
	dropped = t.dropDead(gone)
	keep, ok := t.snapshot(now)
	if !ok {
		return nil, 0, false, nil
	}
	for _, r := range append(bases, keep...) {
		body = appendRecord(body, &r)
	}
	return body, dropped, true, nil
}

// compactDue reports whether the journal has grown enough since it was
// opened or last compacted to be compacted now, with j.mu held.
func (j *Journal) compactDue() bool {
	return !j.compacting && j.size-j.base >= max(j.floor, j.ratio*j.base)
}

// compact compacts the journal, on its own goroutine (started by Append).
func (j *Journal) compact() {
	defer j.compacts.Done()
	start := time.Now()
	before, after, dropped, err := j.compactOnce()
	j.mu.Lock()
	j.compacting = false
	if err != nil {
		// Not again at the next append (a full disk would have every
		// append read the whole journal): once it has grown as much again.
		j.base = max(j.base, before)
	}
	report := j.onCompact
	j.mu.Unlock()
	if report != nil && !errors.Is(err, os.ErrClosed) {
		report(CompactResult{Before: before, After: after, Took: time.Since(start), Err: err, Dropped: dropped})
	}
}

// compactOnce rewrites the journal in its compacted form. The records
// there when it starts are read and replayed without the lock (the file
// only grows); appends wait only while the records made meanwhile are
// copied after them and the new file is renamed over the old one.
func (j *Journal) compactOnce() (before, after int64, dropped int, err error) {
	j.mu.Lock()
	if j.fd < 0 || j.err != nil {
		j.mu.Unlock()
		return 0, 0, 0, os.ErrClosed
	}
	size0 := j.size
	gone := j.gone
	rd, err := fsutil.Dup(j.fd)
	j.mu.Unlock()
	if err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal %q: %w", j.path, err)
	}
	data, err := preadFull(rd, 0, size0)
	unix.Close(rd)
	if err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal %q: %w", j.path, err)
	}
	body, dropped, ok, err := compactRecords(data, time.Now(), gone)
	data = nil
	if err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal %q: %w", j.path, err)
	}
	if !ok || dropped == 0 && int64(journalHeaderLen+len(body)) > size0/4*3 {
		// Not worth a rewrite: wait for as much again.
		j.mu.Lock()
		j.base = max(j.base, size0)
		j.mu.Unlock()
		return size0, size0, 0, nil
	}

	tmp := j.path + compactSuffix
	if err := unix.Unlink(tmp); err != nil && err != unix.ENOENT {
		return size0, size0, 0, fmt.Errorf("compact journal: remove %q: %w", tmp, err)
	}
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_APPEND|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal: %w", err)
	}
	placed := false
	defer func() {
		if !placed {
			unix.Close(fd)
			unix.Unlink(tmp)
		}
	}()
	// Locked before it takes the journal's place, so that an OpenJournal
	// elsewhere never holds it (OpenJournal checks that the file it
	// locked is still the journal).
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal: lock %q: %w", tmp, err)
	}
	if err := fsutil.HoldLock(fd); err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal: lock %q: %w", tmp, err)
	}
	head := append(versionHeader(compactedVersion), body...)
	if err := writeAll(fd, head); err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal: write %q: %w", tmp, err)
	}
	if err := unix.Fdatasync(fd); err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal: sync %q: %w", tmp, err)
	}

	j.syncMu.Lock() // no fdatasync of the old descriptor runs while it is swapped
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.fd < 0 || j.err != nil {
		return size0, size0, 0, os.ErrClosed
	}
	tail, err := preadFull(j.fd, size0, j.size-size0)
	if err == nil && len(tail) > 0 {
		if err = writeAll(fd, tail); err == nil {
			err = unix.Fdatasync(fd)
		}
	}
	if err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal: copy the last records into %q: %w", tmp, err)
	}
	if err := unix.Rename(tmp, j.path); err != nil {
		return size0, size0, 0, fmt.Errorf("compact journal: rename %q: %w", tmp, err)
	}
	placed = true
	unix.Close(j.fd)
	j.fd = fd
	j.size = int64(len(head) + len(tail))
	j.base = j.size
	j.syncedGen = j.gen // every record is in the new file, synced
	if err := fsutil.SyncDir(filepath.Dir(j.path)); err != nil {
		// Until the rename is durable a crash brings back the old file,
		// without what is appended from now on.
		j.setErr(fmt.Errorf("compact journal: sync the directory of %q: %w", j.path, err))
		return size0, j.size, dropped, j.err
	}
	return size0, j.size, dropped, nil
}
