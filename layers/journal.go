package layers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Op is the kind of a mutating operation recorded in the change journal.
// The values are stored on disk: never renumber them, only add new ones.
type Op uint8

// The operations of the journal.
const (
	OpCreate      Op = iota + 1 // new regular file
	OpMkdir                     // new directory
	OpMknod                     // fifo, socket, device
	OpSymlink                   // new symlink
	OpLink                      // Path = new name, Path2 = existing name
	OpUnlink                    // removed non-directory
	OpRmdir                     // removed directory
	OpRename                    // Path = old name, Path2 = new name; Flags = renameat2 flags
	OpWrite                     // a file was opened for writing (or written through mmap/passthrough)
	OpTruncate                  // size changed by truncate
	OpSetattr                   // chmod/chown/utimes; Flags = the FATTR mask
	OpSetxattr                  // extended attribute set
	OpRemovexattr               // extended attribute removed
	OpBase                      // first sight of an original object: Path = its path in the original, Path2 = its signature
	OpKeep                      // a compacted journal's state of one path (compact.go); Flags = keep* bits
	OpKeepLink                  // a compacted journal's link: Path = a name, Path2 = the name it was linked to
)

var opNames = [...]string{
	OpCreate: "create", OpMkdir: "mkdir", OpMknod: "mknod", OpSymlink: "symlink",
	OpLink: "link", OpUnlink: "unlink", OpRmdir: "rmdir", OpRename: "rename",
	OpWrite: "write", OpTruncate: "truncate", OpSetattr: "setattr",
	OpSetxattr: "setxattr", OpRemovexattr: "removexattr", OpBase: "base",
	OpKeep: "keep", OpKeepLink: "keeplink",
}

// String returns the stable lowercase name of o ("create", "mkdir", ...),
// used in JSON output; an unknown value gives "op(N)".
func (o Op) String() string {
	if o.valid() {
		return opNames[o]
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

func (o Op) valid() bool { return o >= OpCreate && o <= OpKeepLink }

// Record is one journal entry.
type Record struct {
	Op    Op
	Path  string    // overlay-relative path, no leading slash ("" = root)
	Path2 string    // second path (rename target, link source), else ""
	Time  time.Time // UTC, nanosecond precision
	Pid   uint32    // caller pid, 0 when unknown
	Flags uint32
}

// Errors for a journal this code cannot read.
var (
	ErrJournalMagic   = errors.New("not an sbxfs journal (bad magic or corrupt header)")
	ErrJournalVersion = errors.New("unsupported sbxfs journal version")
	// ErrJournalDamaged: bytes past the last valid record are not a torn
	// append (a crash) but damage, so later records may be lost.
	ErrJournalDamaged = errors.New("the change journal is damaged")
)

// tornTail reports whether the bytes after the last valid record are what
// an interrupted append leaves: part of one record, or zeros (blocks
// allocated but never written). Anything else (a whole record with a bad
// checksum and more after it, a garbage length) is damage.
func tornTail(tail []byte) bool {
	if len(tail) < recordHeaderLen || !slices.ContainsFunc(tail, func(b byte) bool { return b != 0 }) {
		return true
	}
	plen := binary.LittleEndian.Uint32(tail)
	if plen < recordFixedLen || plen > maxRecordPayload {
		return false
	}
	return uint64(recordHeaderLen)+uint64(plen) >= uint64(len(tail)) // the last record, or cut short
}

// droppedGlob matches the copies of damaged journal tails kept beside the
// journal at path.
func droppedGlob(path string) string { return path + ".dropped-*" }

// CheckJournalIntact returns ErrJournalDamaged when the journal at path
// has a damaged tail, or when an earlier open set a damaged tail aside
// (journal.dropped-*): the change set would miss what was recorded there.
func CheckJournalIntact(path string) error {
	if kept, _ := filepath.Glob(droppedGlob(path)); len(kept) > 0 {
		return fmt.Errorf("%w: records past the damage were set aside in %s and are not in the change set; "+
			"rollback to discard the sandbox, or move that file away to commit what the journal still holds", ErrJournalDamaged, kept[0])
	}
	return nil
}

// The format, described in docs/journal-format.md.
const (
	journalMagic     = "SBXFSJNL"
	journalVersion   = 1                     // a journal as its appends made it
	compactedVersion = 2                     // a journal compaction rewrote (compact.go): it may hold keep records
	journalHeaderLen = 16                    // magic, version, CRC of both
	recordHeaderLen  = 8                     // payload length, payload CRC
	recordFixedLen   = 1 + 8 + 4 + 4 + 4 + 4 // op, nanos, pid, flags, two string lengths
	maxRecordPayload = 1 << 20
)

var journalCRC = crc32.MakeTable(crc32.Castagnoli)

// journalHeader returns the header of a version 1 journal.
func journalHeader() []byte { return versionHeader(journalVersion) }

// versionHeader returns the header of a journal of version v.
func versionHeader(v uint32) []byte {
	b := append(make([]byte, 0, journalHeaderLen), journalMagic...)
	b = binary.LittleEndian.AppendUint32(b, v)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, journalCRC))
}

// isTornHeader reports whether data is a strict prefix of the header: the
// file was created but its header not (fully) written.
func isTornHeader(data []byte) bool {
	h := journalHeader()
	return len(data) < len(h) && string(data) == string(h[:len(data)])
}

// appendRecord appends the encoding of r, which must be valid, to b.
func appendRecord(b []byte, r *Record) []byte {
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, uint32(recordFixedLen+len(r.Path)+len(r.Path2)))
	b = append(b, 0, 0, 0, 0) // CRC, set below
	b = append(b, byte(r.Op))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Time.UnixNano()))
	b = binary.LittleEndian.AppendUint32(b, r.Pid)
	b = binary.LittleEndian.AppendUint32(b, r.Flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Path)))
	b = append(b, r.Path...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Path2)))
	b = append(b, r.Path2...)
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(b[start+recordHeaderLen:], journalCRC))
	return b
}

// DecodeJournal decodes a whole journal. It returns the records up to the
// first one that is torn or corrupt and validLen, the length of the header
// and those records. err is only for a bad header (ErrJournalMagic,
// ErrJournalVersion). It never panics and allocates at most in proportion to
// len(data).
func DecodeJournal(data []byte) (recs []Record, validLen int, err error) {
	validLen, err = eachRecord(data, func(r *Record) { recs = append(recs, *r) })
	return recs, validLen, err
}

// eachRecord is DecodeJournal handing each record to fn in turn rather
// than holding them all (a compaction replays millions).
func eachRecord(data []byte, fn func(*Record)) (validLen int, err error) {
	last, err := checkJournalHeader(data)
	if err != nil {
		return 0, err
	}
	off := journalHeaderLen
	for {
		r, n, ok := decodeRecord(data[off:], last)
		if !ok {
			return off, nil
		}
		fn(&r)
		off += n
	}
}

// scanJournal is DecodeJournal's validLen and err without the records:
// OpenJournal checks a journal without holding a copy of it (a long-lived
// sandbox's journal runs to millions of records).
func scanJournal(data []byte) (validLen int, err error) {
	last, err := checkJournalHeader(data)
	if err != nil {
		return 0, err
	}
	off := journalHeaderLen
	for {
		_, n, ok := checkRecord(data[off:], last)
		if !ok {
			return off, nil
		}
		off += n
	}
}

// checkJournalHeader checks magic, then version (before the checksum: a
// future version may lay out the rest of its header differently), then CRC.
// It returns the last op the version knows.
func checkJournalHeader(data []byte) (last Op, err error) {
	if len(data) < len(journalMagic) || string(data[:len(journalMagic)]) != journalMagic {
		return 0, fmt.Errorf("%w: magic %q", ErrJournalMagic, data[:min(len(data), len(journalMagic))])
	}
	if len(data) < journalHeaderLen {
		return 0, fmt.Errorf("%w: header truncated at %d bytes", ErrJournalMagic, len(data))
	}
	switch v := binary.LittleEndian.Uint32(data[8:]); v {
	case journalVersion:
		last = OpBase
	case compactedVersion:
		last = OpKeepLink
	default:
		return 0, fmt.Errorf("%w: version %d, this sbxfs reads versions %d and %d", ErrJournalVersion, v, journalVersion, compactedVersion)
	}
	if binary.LittleEndian.Uint32(data[12:]) != crc32.Checksum(data[:12], journalCRC) {
		return 0, fmt.Errorf("%w: header checksum mismatch", ErrJournalMagic)
	}
	return last, nil
}

// checkRecord checks that b starts with a whole valid record, of an op up
// to last, and returns its payload and encoded length.
func checkRecord(b []byte, last Op) (p []byte, n int, ok bool) {
	if len(b) < recordHeaderLen {
		return nil, 0, false
	}
	plen := binary.LittleEndian.Uint32(b)
	if plen < recordFixedLen || plen > maxRecordPayload || uint64(plen) > uint64(len(b)-recordHeaderLen) {
		return nil, 0, false
	}
	p = b[recordHeaderLen : recordHeaderLen+int(plen)]
	if crc32.Checksum(p, journalCRC) != binary.LittleEndian.Uint32(b[4:]) {
		return nil, 0, false
	}
	if op := Op(p[0]); !op.valid() || op > last {
		return nil, 0, false
	}
	rest := p[17:]
	for range 2 { // Path, Path2
		if _, rest, ok = cutString(rest); !ok {
			return nil, 0, false
		}
	}
	if len(rest) != 0 {
		return nil, 0, false
	}
	return p, recordHeaderLen + int(plen), true
}

// decodeRecord decodes the record at the start of b and returns it with its
// encoded length; ok is false if b does not start with a whole valid record.
func decodeRecord(b []byte, last Op) (r Record, n int, ok bool) {
	p, n, ok := checkRecord(b, last)
	if !ok {
		return r, 0, false
	}
	r = Record{
		Op:    Op(p[0]),
		Time:  time.Unix(0, int64(binary.LittleEndian.Uint64(p[1:]))).UTC(),
		Pid:   binary.LittleEndian.Uint32(p[9:]),
		Flags: binary.LittleEndian.Uint32(p[13:]),
	}
	path, rest, _ := cutString(p[17:])
	path2, _, _ := cutString(rest)
	r.Path, r.Path2 = string(path), string(path2)
	return r, n, true
}

// cutString cuts a u32 length and that many bytes from the start of b.
func cutString(b []byte) (s []byte, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := binary.LittleEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, nil, false
	}
	return b[4 : 4+n], b[4+n:], true
}

// Journal is an open change journal, appended to by one process (OpenJournal
// takes an exclusive flock). It is safe for concurrent use.
type Journal struct {
	path   string
	syncMu sync.Mutex // serialises Sync and Close; held across fdatasync
	mu     sync.Mutex // guards the fields below; never held across fdatasync

	fd        int    // -1 once closed
	size      int64  // bytes of header and records in the file
	gen       uint64 // number of appends so far
	syncedGen uint64 // gen covered by the last successful Sync
	err       error  // sticky: the file or its durability is in doubt

	base       int64                 // size when opened (0) or last compacted (compact.go)
	floor      int64                 // compactFloor when opened
	ratio      int64                 // compactRatio when opened
	compacting bool                  // a compaction runs
	compacts   sync.WaitGroup        // the compaction running, which Close waits for
	onCompact  func(CompactResult)   // told of each compaction, when set
	onDoubt    func()                // told once err is set, when set
	gone       func([]string) []bool // confirms dead paths hold nothing (compact.go dropDead), when set
}

const journalOpenFlags = unix.O_RDWR | unix.O_APPEND | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC

// OpenJournal opens the journal at path for appending, creating it (mode
// 0600) with its header when absent. path itself must not be a symlink. An
// existing journal is checked (ErrJournalMagic, ErrJournalVersion) and
// scanned; a torn or corrupt tail, everything from the first bad record on,
// is truncated away. A second OpenJournal of the same file, in any
// process, fails with EWOULDBLOCK until Close.
func OpenJournal(path string) (*Journal, error) {
	for attempt := 0; ; attempt++ {
		fd, err := unix.Open(path, journalOpenFlags|unix.O_CREAT|unix.O_EXCL, 0o600)
		if errors.Is(err, unix.EEXIST) {
			fd, err = unix.Open(path, journalOpenFlags, 0)
		}
		if err != nil {
			return nil, fmt.Errorf("open journal %q: %w", path, err)
		}
		j := &Journal{path: path, fd: fd, floor: compactFloor, ratio: compactRatio}
		err = j.load()
		if err == nil {
			return j, nil
		}
		unix.Close(fd)
		if !errors.Is(err, errReplaced) || attempt == 3 {
			return nil, fmt.Errorf("open journal %q: %w", path, err)
		}
	}
}

// errReplaced: the file load locked is no longer the journal (a
// compaction renamed a new one over it meanwhile): open it again.
var errReplaced = errors.New("the journal was replaced while it was opened")

// load locks the file, then reads it or writes the header of a new one.
// O_NONBLOCK in the open flags keeps a FIFO planted at the path from
// blocking; on a regular file it has no effect.
func (j *Journal) load() error {
	if err := unix.Flock(j.fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("lock (open elsewhere?): %w", err)
	}
	var locked, now unix.Stat_t
	if err := unix.Fstat(j.fd, &locked); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if err := unix.Lstat(j.path, &now); err != nil || now.Ino != locked.Ino || now.Dev != locked.Dev {
		return errReplaced
	}
	// What says to another process that this journal is served
	// (serverDied): the flock is seen by no one but a second locker.
	if err := fsutil.HoldLock(j.fd); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	// What a compaction interrupted by a crash left (the journal itself
	// is whole: the rename comes last).
	if err := unix.Unlink(j.path + compactSuffix); err != nil && err != unix.ENOENT {
		return fmt.Errorf("remove the unfinished compaction %q: %w", j.path+compactSuffix, err)
	}
	data, err := readJournalFd(j.fd)
	if err != nil {
		return err
	}
	if isTornHeader(data) {
		return j.writeHeader()
	}
	valid, err := scanJournal(data)
	if err != nil {
		return err
	}
	if valid < len(data) {
		if !tornTail(data[valid:]) {
			if err := j.keepDropped(data[valid:]); err != nil {
				return err
			}
		}
		if err := unix.Ftruncate(j.fd, int64(valid)); err != nil {
			return fmt.Errorf("truncate torn tail at %d of %d bytes: %w", valid, len(data), err)
		}
		if err := unix.Fdatasync(j.fd); err != nil {
			return fmt.Errorf("sync after truncating the tail: %w", err)
		}
	}
	j.size = int64(valid)
	return nil
}

// keepDropped saves the bytes past the last valid record before they are cut
// off: a torn tail is harmless, but a flipped byte in the middle would
// otherwise take every later record with it. The copy sits next to the
// journal (journal.dropped-<unix nanos>, 0600) for a person or a repair
// tool to look at.
func (j *Journal) keepDropped(tail []byte) error {
	if len(tail) <= recordHeaderLen+recordFixedLen {
		return nil // too short to hold a whole record: a torn append
	}
	name := fmt.Sprintf("%s.dropped-%d", j.path, time.Now().UnixNano())
	if err := fsutil.WriteFileAtomic(name, tail, 0o600); err != nil {
		return fmt.Errorf("keep the %d bytes past the last valid record: %w", len(tail), err)
	}
	return nil
}

// writeHeader starts a new journal: header, fdatasync, fsync of the directory.
func (j *Journal) writeHeader() error {
	if err := unix.Ftruncate(j.fd, 0); err != nil {
		return fmt.Errorf("truncate torn header: %w", err)
	}
	if err := j.write(journalHeader()); err != nil {
		return fmt.Errorf("write header: %w", err)
	}
	if err := unix.Fdatasync(j.fd); err != nil {
		return fmt.Errorf("sync header: %w", err)
	}
	return fsutil.SyncDir(filepath.Dir(j.path))
}

// Append adds r to the journal. A zero r.Time means now; the time is stored
// in UTC with nanosecond precision (years 1678 to 2262). The record is
// written with one write(2) on an O_APPEND fd, so a process crash leaves at
// worst a torn tail that the next OpenJournal removes; it is durable after
// Sync. If the write fails, the partial record is truncated away; if even
// that fails, every later Append and Sync fails. Append fails after Close.
func (j *Journal) Append(r Record) error {
	if !r.Op.valid() || r.Op == OpKeep || r.Op == OpKeepLink { // those only a compaction writes
		return fmt.Errorf("journal append: unknown op %d: %w", r.Op, unix.EINVAL)
	}
	if n := recordFixedLen + len(r.Path) + len(r.Path2); n > maxRecordPayload {
		return fmt.Errorf("journal append %s: record of %d bytes over the limit: %w", r.Op, n, unix.ENAMETOOLONG)
	}
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = time.Unix(0, r.Time.UnixNano()).UTC() // exactly what a reader decodes
	buf := appendRecord(nil, &r)

	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.fd < 0:
		return fmt.Errorf("journal append: %w", os.ErrClosed)
	case j.err != nil:
		return fmt.Errorf("journal append: %w", j.err)
	}
	if err := j.write(buf); err != nil {
		return fmt.Errorf("journal %q: append %s %q: %w", j.path, r.Op, r.Path, err)
	}
	j.gen++
	if j.compactDue() {
		j.compacting = true
		j.compacts.Add(1)
		go j.compact()
	}
	return nil
}

// OnCompact has fn told of every compaction of the journal from now on
// (compact.go), from the goroutine that made it.
func (j *Journal) OnCompact(fn func(CompactResult)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.onCompact = fn
}

// OnDoubt has fn called once the journal can no longer say that it
// holds every record appended (a failed fdatasync, a record it could
// neither write nor take back), with the journal's lock held: fn must
// not call the journal.
func (j *Journal) OnDoubt(fn func()) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.onDoubt = fn
}

// setErr makes err the journal's sticky error, with j.mu held, and tells
// OnDoubt's function the first time.
func (j *Journal) setErr(err error) {
	if j.err != nil {
		return
	}
	j.err = err
	if j.onDoubt != nil {
		j.onDoubt()
	}
}

// ConfirmGone has the compactions from now on drop the dead paths (made
// in the sandbox and gone again: compact.go, dropDead) for which fn,
// given paths, confirms that the upper layer holds nothing there (true
// at a path's index). Without it a compaction keeps them.
func (j *Journal) ConfirmGone(fn func(paths []string) []bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.gone = fn
}

// write appends buf to the file at j.size, with j.mu held; on error the
// file is truncated back to j.size.
func (j *Journal) write(buf []byte) error {
	if err := writeAll(j.fd, buf); err != nil {
		if terr := unix.Ftruncate(j.fd, j.size); terr != nil {
			j.setErr(fmt.Errorf("partial record left in %q (truncate: %v): %w", j.path, terr, err))
			return j.err
		}
		return err
	}
	j.size += int64(len(buf))
	return nil
}

// writeAll writes b to fd. A short write (the disk filled up mid-record)
// is continued to learn the errno.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil && n == 0 {
			err = unix.EIO
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Sync makes every appended record durable (fdatasync). It returns at once
// when nothing was appended since the last Sync. After a failed fdatasync
// the kernel may have dropped the unwritten pages, so the failure is sticky:
// later Appends and Syncs fail too.
func (j *Journal) Sync() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	return j.syncLocked()
}

// syncLocked is Sync with j.syncMu held.
func (j *Journal) syncLocked() error {
	j.mu.Lock()
	fd, gen, clean, err := j.fd, j.gen, j.gen == j.syncedGen, j.err
	j.mu.Unlock()
	switch {
	case fd < 0:
		return fmt.Errorf("journal sync: %w", os.ErrClosed)
	case err != nil:
		return fmt.Errorf("journal sync: %w", err)
	case clean:
		return nil
	}
	// fd stays open: Close needs j.syncMu, held here.
	if err := unix.Fdatasync(fd); err != nil {
		err = fmt.Errorf("journal %q: fdatasync: %w", j.path, err)
		j.mu.Lock()
		j.setErr(err)
		j.mu.Unlock()
		return err
	}
	j.mu.Lock()
	j.syncedGen = gen
	j.mu.Unlock()
	return nil
}

// Records reads every record of the journal back from its file: those
// there when OpenJournal read it and those appended since. The records
// are not kept in memory: a serving process appends for as long as it
// runs (a build that makes and renames files all day), and holding each
// record took ~350 bytes of it (a 12 MB journal of 300,000 records grew
// its RSS from 15 to 122 MB). Only the change set read in process needs
// them.
func (j *Journal) Records() ([]Record, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.fd < 0 {
		return ReadJournal(j.path)
	}
	data, err := readJournalFd(j.fd)
	if err != nil {
		return nil, fmt.Errorf("read journal %q: %w", j.path, err)
	}
	recs, _, err := DecodeJournal(data[:min(int64(len(data)), j.size)])
	if err != nil {
		return nil, fmt.Errorf("read journal %q: %w", j.path, err)
	}
	return recs, nil
}

// Close syncs the journal and closes it, releasing its lock, once a
// compaction under way has ended. Records still works after Close; Append
// and Sync fail.
func (j *Journal) Close() error {
	err := j.close()
	j.compacts.Wait() // it finds the journal closed and leaves it
	return err
}

func (j *Journal) close() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	err := j.syncLocked()
	if errors.Is(err, os.ErrClosed) {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if cerr := unix.Close(j.fd); cerr != nil && err == nil {
		err = fmt.Errorf("journal %q: close: %w", j.path, cerr)
	}
	j.fd = -1
	return err
}

// ReadJournal returns the valid records of the journal at path without
// changing it: a torn or corrupt tail is ignored, not truncated. It does not
// take the lock, so it can read a journal open in another process.
func ReadJournal(path string) ([]Record, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read journal %q: %w", path, err)
	}
	defer unix.Close(fd)
	data, err := readJournalFd(fd)
	if err != nil {
		return nil, fmt.Errorf("read journal %q: %w", path, err)
	}
	if isTornHeader(data) {
		return nil, nil
	}
	recs, valid, err := DecodeJournal(data)
	if err != nil {
		return nil, fmt.Errorf("read journal %q: %w", path, err)
	}
	if valid < len(data) && !tornTail(data[valid:]) {
		return recs, fmt.Errorf("read journal %q: %w: %d bytes after record %d are not a valid record; "+
			"rollback to discard the sandbox", path, ErrJournalDamaged, len(data)-valid, len(recs))
	}
	return recs, nil
}

// readJournalFd reads the whole regular file open as fd.
func readJournalFd(fd int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("not a regular file (mode %#o): %w", st.Mode, unix.EINVAL)
	}
	return preadAll(fd, 0, st.Size)
}

// preadAll reads up to n bytes of fd at off: fewer where the file ends.
func preadAll(fd int, off, n int64) ([]byte, error) {
	buf := make([]byte, n)
	done := int64(0)
	for done < n {
		m, err := unix.Pread(fd, buf[done:], off+done)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read at %d: %w", off+done, err)
		}
		if m == 0 {
			break
		}
		done += int64(m)
	}
	return buf[:done], nil
}

// preadFull reads exactly n bytes of fd at off.
func preadFull(fd int, off, n int64) ([]byte, error) {
	b, err := preadAll(fd, off, n)
	if err == nil && int64(len(b)) < n {
		err = fmt.Errorf("read %d bytes at %d: the file ends after %d: %w", n, off, len(b), unix.EIO)
	}
	return b, err
}
