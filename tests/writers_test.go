package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRealConcurrentWriters: 32 writer processes at once (this test
// binary, re-executed) make random changes through the mount: create,
// write, append, truncate, chmod, setxattr, rename and unlink files,
// hard links and symlinks, mkdir, rmdir and rename directories, in
// directories they share (from the original and made at run time, all
// writers creating the same ones) and in their own. Every writer has its
// own names, so no two operations race on one name and the end state does
// not depend on the interleaving; each writer checks, as it goes, that
// what it reads back (content, mode, link count, symlink target, its
// entries in a shared listing) is what it wrote, and logs its operations.
// The logs replayed on a plain copy of the original give the expected
// tree; the mount must equal it, and after sbxfs commit the original too.
//
// -args -seed S repeats a run, -writers.ops N makes it longer.
func TestRealConcurrentWriters(t *testing.T) {
	rtNeedCLI(t)
	const writers = 32
	ops := *flagWriterOps
	seed := *flagSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -args -seed %d)", seed, seed)

	files := map[string]string{"s0/common.txt": "shared, untouched\n", "s3/deep/common.txt": "deep\n"}
	for _, d := range rtwLowerShared {
		files[d+"/"] = ""
	}
	for id := range writers {
		loc := rtwLowerShared[id%len(rtwLowerShared)]
		files[loc+"/"+rtwName(id, "orig")] = rtwOrigContent(id)
		files[loc+"/"+rtwName(id, "odir")+"/inside"] = rtwOrigContent(id)
	}
	orig := newOrig(t, files)
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig)

	logDir := t.TempDir()
	type proc struct {
		cmd *exec.Cmd
		out syncBuffer
		err error
	}
	procs := make([]*proc, writers)
	done := make(chan int, writers)
	start := time.Now()
	for id := range writers {
		p := &proc{}
		procs[id] = p
		cmd := helperCmd(t, "rt-writer", sb.mnt, strconv.Itoa(id), strconv.FormatInt(seed+int64(id), 10),
			strconv.Itoa(ops), filepath.Join(logDir, fmt.Sprintf("w%02d.log", id)))
		cmd.Stdout, cmd.Stderr = &p.out, &p.out
		p.cmd = cmd
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			p.err = cmd.Wait()
			done <- id
		}()
	}
	timeout := time.After(3 * time.Minute)
	for range writers {
		select {
		case id := <-done:
			if p := procs[id]; p.err != nil {
				t.Errorf("writer %d: %v\n%s", id, p.err, rtTail(p.out.String(), 4000))
			}
		case <-timeout:
			for _, p := range procs {
				_ = p.cmd.Process.Kill() // those still running; the others are reaped
			}
			t.Fatalf("the writers did not finish within 3 minutes")
		}
	}
	t.Logf("%d writers x %d operations through the mount: %v", writers, ops, time.Since(start).Round(time.Millisecond))
	if t.Failed() {
		t.FailNow()
	}

	// The expected tree: every writer's log replayed, one writer after
	// the other, on the plain copy.
	n := 0
	for id := range writers {
		b, err := os.ReadFile(filepath.Join(logDir, fmt.Sprintf("w%02d.log", id)))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var op rtwOp
			if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
				t.Fatalf("log of writer %d: %v", id, err)
			}
			if err := op.do(ref); err != nil {
				t.Fatalf("replay of writer %d on the plain copy: %s: %v", id, op, err)
			}
			n++
		}
	}
	t.Logf("%d operations replayed on the plain copy", n)
	rtCompareTrees(t, "the mount vs the writers' logs replayed on the plain copy", ref, sb.mnt, viewOpts, nil)
	rtCommitOpts(t, sb, "writers", viewOpts)
	rtCompareTrees(t, "the original after the commit vs the writers' logs replayed on the plain copy", ref, orig, viewOpts, nil)
}

var flagWriterOps = flag.Int("writers.ops", 120, "operations of each writer process in TestRealConcurrentWriters")

func rtTail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func init() { extraHelpers["rt-writer"] = rtWriterMain }

// The shared directories: in the original, and made at run time by every
// writer (mkdir -p, racing each other).
var (
	rtwLowerShared = []string{"s0", "s1", "s2", "s3", "s3/deep"}
	rtwNewShared   = []string{"n0", "n1", "n1/x", "s2/n2"}
)

func rtwName(id int, what string) string { return fmt.Sprintf("w%02d-%s", id, what) }

func rtwOrigContent(id int) string {
	return strings.Repeat(fmt.Sprintf("original file of writer %d\n", id), 3+id)
}

// rtwOp is one logged operation. Data is never logged: it is made from
// Seed and Size.
type rtwOp struct {
	Op   string `json:"op"`
	Path string `json:"path"`
	To   string `json:"to,omitempty"`
	Seed int64  `json:"seed,omitempty"`
	Size int    `json:"size,omitempty"`
	Off  int64  `json:"off,omitempty"`
	Mode uint32 `json:"mode,omitempty"`
	Sync bool   `json:"sync,omitempty"`
}

func (o rtwOp) String() string {
	b, _ := json.Marshal(o)
	return string(b)
}

func rtwData(seed int64, n int) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// do applies the operation to the tree at root.
func (o rtwOp) do(root string) error {
	p := filepath.Join(root, o.Path)
	to := filepath.Join(root, o.To)
	switch o.Op {
	case "mkdirp":
		return os.MkdirAll(p, 0o755)
	case "create":
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, o.Mode)
		if err != nil {
			return err
		}
		return rtwFinish(fd, func() error { return rtWriteAll(fd, rtwData(o.Seed, o.Size)) }, o.Sync)
	case "write":
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return rtwFinish(fd, func() error {
			_, err := unix.Pwrite(fd, rtwData(o.Seed, o.Size), o.Off)
			return err
		}, o.Sync)
	case "append":
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return rtwFinish(fd, func() error { return rtWriteAll(fd, rtwData(o.Seed, o.Size)) }, o.Sync)
	case "truncate":
		return unix.Truncate(p, o.Off)
	case "chmod":
		return unix.Chmod(p, o.Mode)
	case "setxattr":
		return unix.Lsetxattr(p, "user.w", rtwData(o.Seed, o.Size), 0)
	case "unlink":
		return unix.Unlink(p)
	case "rename", "rendir":
		return unix.Rename(p, to)
	case "link":
		return unix.Link(p, to)
	case "symlink":
		return unix.Symlink(o.To, p)
	case "mkdir":
		return unix.Mkdir(p, o.Mode)
	case "rmdir":
		return unix.Rmdir(p)
	}
	return fmt.Errorf("unknown operation %q", o.Op)
}

func rtwFinish(fd int, f func() error, sync bool) error {
	err := f()
	if err == nil && sync {
		err = unix.Fsync(fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}

// rtwObj is what one of a writer's names holds (hard links share one).
type rtwObj struct {
	dir    bool
	target string // symlink (non-empty)
	data   []byte
	mode   uint32
}

// rtwModel is one writer's view of its own names.
type rtwModel struct {
	id   int
	rng  *rand.Rand
	ents map[string]*rtwObj
	hist []string // the last operations, shown when a check fails
}

func (m *rtwModel) apply(o rtwOp) {
	switch o.Op {
	case "create":
		m.ents[o.Path] = &rtwObj{data: rtwData(o.Seed, o.Size), mode: o.Mode}
	case "write":
		e := m.ents[o.Path]
		d := rtwData(o.Seed, o.Size)
		if end := int(o.Off) + len(d); end > len(e.data) {
			e.data = append(e.data, make([]byte, end-len(e.data))...)
		}
		copy(e.data[o.Off:], d)
	case "append":
		e := m.ents[o.Path]
		e.data = append(e.data, rtwData(o.Seed, o.Size)...)
	case "truncate":
		e := m.ents[o.Path]
		if int(o.Off) <= len(e.data) {
			e.data = e.data[:o.Off]
		} else {
			e.data = append(e.data, make([]byte, int(o.Off)-len(e.data))...)
		}
	case "chmod":
		m.ents[o.Path].mode = o.Mode
	case "unlink", "rmdir":
		delete(m.ents, o.Path)
	case "rename":
		if m.ents[o.To] != m.ents[o.Path] { // two names of one file: rename does nothing
			m.ents[o.To] = m.ents[o.Path]
			delete(m.ents, o.Path)
		}
	case "rendir":
		for p, e := range m.ents {
			if rel, ok := rtwUnder(p, o.Path, o.To); ok {
				delete(m.ents, p)
				m.ents[rel] = e
			}
		}
	case "link":
		m.ents[o.To] = m.ents[o.Path]
	case "symlink":
		m.ents[o.Path] = &rtwObj{target: o.To}
	case "mkdir":
		m.ents[o.Path] = &rtwObj{dir: true, mode: o.Mode}
	}
}

// rtwUnder maps p under old to the same place under new.
func rtwUnder(p, old, new string) (string, bool) {
	if p == old {
		return new, true
	}
	if strings.HasPrefix(p, old+"/") {
		return new + p[len(old):], true
	}
	return "", false
}

func (m *rtwModel) pick(kind func(*rtwObj) bool) string {
	var ps []string
	for p, e := range m.ents {
		if kind == nil || kind(e) {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return ""
	}
	slices.Sort(ps)
	return ps[m.rng.Intn(len(ps))]
}

func rtwIsFile(e *rtwObj) bool   { return !e.dir && e.target == "" }
func rtwIsNonDir(e *rtwObj) bool { return !e.dir }
func rtwIsDir(e *rtwObj) bool    { return e.dir }

func (m *rtwModel) nlink(e *rtwObj) int {
	n := 0
	for _, f := range m.ents {
		if f == e {
			n++
		}
	}
	return n
}

// locations are the directories the writer may put names in: every
// shared one and its own.
func (m *rtwModel) location() string {
	locs := append(slices.Clone(rtwLowerShared), rtwNewShared...)
	for p, e := range m.ents {
		if e.dir {
			locs = append(locs, p)
		}
	}
	slices.Sort(locs)
	return locs[m.rng.Intn(len(locs))]
}

// free returns a path of the writer's that holds nothing, "" when it
// finds none; names come from a small set, so they are used again.
func (m *rtwModel) free(kind string) string {
	for range 10 {
		p := filepath.Join(m.location(), rtwName(m.id, fmt.Sprintf("%s%d", kind, m.rng.Intn(12))))
		if _, ok := m.ents[p]; !ok {
			return p
		}
	}
	return ""
}

func (m *rtwModel) empty(dir string) bool {
	for p := range m.ents {
		if strings.HasPrefix(p, dir+"/") {
			return false
		}
	}
	return true
}

// next chooses an operation that must succeed on the writer's state
// ("" Op: nothing fits this time).
func (m *rtwModel) next() rtwOp {
	r := m.rng
	o := rtwOp{Seed: r.Int63(), Sync: r.Intn(8) == 0}
	switch x := r.Intn(100); {
	case x < 20:
		o.Op, o.Path, o.Size, o.Mode = "create", m.free("f"), r.Intn(3000), []uint32{0o644, 0o600, 0o755, 0o640}[r.Intn(4)]
	case x < 30:
		o.Op, o.Path, o.Size = "write", m.pick(rtwIsFile), 1+r.Intn(2000)
		if e := m.ents[o.Path]; e != nil {
			o.Off = int64(r.Intn(len(e.data) + 100))
		}
	case x < 37:
		o.Op, o.Path, o.Size = "append", m.pick(rtwIsFile), 1+r.Intn(1000)
	case x < 41:
		o.Op, o.Path = "truncate", m.pick(rtwIsFile)
		if e := m.ents[o.Path]; e != nil {
			o.Off = int64(r.Intn(len(e.data) + 500))
		}
	case x < 45:
		o.Op, o.Path, o.Mode = "chmod", m.pick(rtwIsFile), []uint32{0o644, 0o600, 0o755, 0o400, 0o4755}[r.Intn(5)]
	case x < 48:
		o.Op, o.Path, o.Size = "setxattr", m.pick(rtwIsFile), r.Intn(64)
	case x < 56:
		o.Op, o.Path = "unlink", m.pick(rtwIsNonDir)
	case x < 70:
		o.Op, o.Path = "rename", m.pick(rtwIsNonDir)
		if r.Intn(3) == 0 {
			o.To = m.pick(rtwIsNonDir) // over another of its names
		} else {
			o.To = m.free("r")
		}
		if o.To == o.Path {
			o.To = ""
		}
	case x < 75:
		o.Op, o.Path, o.To = "link", m.pick(rtwIsFile), m.free("h")
	case x < 80:
		o.Op, o.Path, o.To = "symlink", m.free("l"), fmt.Sprintf("../target-%d", r.Intn(100))
	case x < 88:
		o.Op, o.Path, o.Mode = "mkdir", m.free("d"), []uint32{0o755, 0o700, 0o711}[r.Intn(3)] // none the umask changes
	case x < 93:
		o.Op, o.Path = "rmdir", m.pick(rtwIsDir)
		if o.Path != "" && !m.empty(o.Path) {
			o.Path = ""
		}
	default:
		o.Op, o.Path = "rendir", m.pick(rtwIsDir)
		if o.Path != "" {
			o.To = m.free("d")
			if o.To == "" || o.To == o.Path || strings.HasPrefix(o.To, o.Path+"/") {
				o.To = ""
			}
		}
	}
	needTo := map[string]bool{"rename": true, "link": true, "rendir": true, "symlink": true}
	if o.Path == "" || (needTo[o.Op] && o.To == "") {
		return rtwOp{}
	}
	return o
}

// check reads back what the writer has at p, or lists a directory and
// compares the writer's names in it with its model.
func (m *rtwModel) check(root string) error {
	if m.rng.Intn(3) == 0 {
		dir := m.location()
		err := m.checkListing(root, dir)
		if err != nil {
			// Say whether a second listing is right: a cache that
			// went stale stays wrong, a race of the moment does not.
			again := "right"
			if err2 := m.checkListing(root, dir); err2 != nil {
				again = err2.Error()
			}
			return fmt.Errorf("%w (listed again: %s)", err, again)
		}
		return nil
	}
	if p := m.pick(nil); p != "" {
		return m.checkPath(root, p)
	}
	return nil
}

// checkListing lists dir and compares the writer's names in it with its
// model.
func (m *rtwModel) checkListing(root, dir string) error {
	f, err := os.Open(filepath.Join(root, dir))
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	var got, want []string
	_, own := m.ents[dir] // every name in its own directories is its
	for _, n := range names {
		if own || strings.HasPrefix(n, rtwName(m.id, "")) {
			got = append(got, n)
		}
	}
	for p := range m.ents {
		if filepath.Dir(p) == dir {
			want = append(want, filepath.Base(p))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("listing of %s: my names %q, want %q", dir, got, want)
	}
	return nil
}

// checkPath reads back what the writer has at p.
func (m *rtwModel) checkPath(root, p string) error {
	e := m.ents[p]
	full := filepath.Join(root, p)
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		return fmt.Errorf("lstat %s: %w", p, err)
	}
	switch {
	case e.dir:
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Mode&0o7777 != e.mode {
			return fmt.Errorf("%s: mode %#o, want a directory %#o", p, st.Mode, e.mode)
		}
	case e.target != "":
		got, err := os.Readlink(full)
		if err != nil || got != e.target {
			return fmt.Errorf("%s: symlink to %q (%v), want %q", p, got, err, e.target)
		}
	default:
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != e.mode || int(st.Nlink) != m.nlink(e) {
			return fmt.Errorf("%s: mode %#o nlink %d, want a file %#o nlink %d", p, st.Mode, st.Nlink, e.mode, m.nlink(e))
		}
		b, err := os.ReadFile(full)
		if err != nil {
			return err
		}
		if !bytes.Equal(b, e.data) {
			return fmt.Errorf("%s: content (%d bytes) is not what I wrote (%d bytes)", p, len(b), len(e.data))
		}
	}
	return nil
}

// rtWriterMain is one writer process: args root id seed ops logfile.
func rtWriterMain(args []string) int {
	if len(args) != 5 {
		fmt.Fprintln(os.Stderr, "rt-writer: want root id seed ops logfile")
		return 2
	}
	root := args[0]
	id, _ := strconv.Atoi(args[1])
	seed, _ := strconv.ParseInt(args[2], 10, 64)
	nops, _ := strconv.Atoi(args[3])
	lf, err := os.Create(args[4])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log := bufio.NewWriter(lf)
	defer func() {
		log.Flush()
		lf.Close()
	}()
	m := &rtwModel{id: id, rng: rand.New(rand.NewSource(seed)), ents: map[string]*rtwObj{}}
	loc := rtwLowerShared[id%len(rtwLowerShared)]
	m.ents[loc+"/"+rtwName(id, "orig")] = &rtwObj{data: []byte(rtwOrigContent(id)), mode: 0o644}
	m.ents[loc+"/"+rtwName(id, "odir")] = &rtwObj{dir: true, mode: 0o755}
	m.ents[loc+"/"+rtwName(id, "odir")+"/inside"] = &rtwObj{data: []byte(rtwOrigContent(id)), mode: 0o644}
	do := func(o rtwOp) error {
		if err := o.do(root); err != nil {
			return fmt.Errorf("writer %d, %s: %w", id, o, err)
		}
		m.apply(o)
		if m.hist = append(m.hist, o.String()); len(m.hist) > 12 {
			m.hist = m.hist[1:]
		}
		b, _ := json.Marshal(o)
		log.Write(append(b, '\n'))
		return nil
	}
	// Every writer makes the shared directories, in its own order.
	shared := slices.Clone(rtwNewShared)
	m.rng.Shuffle(len(shared), func(i, j int) { shared[i], shared[j] = shared[j], shared[i] })
	for _, d := range shared {
		if err := do(rtwOp{Op: "mkdirp", Path: d}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	for i := 0; i < nops; {
		if m.rng.Intn(5) == 0 {
			if err := m.check(root); err != nil {
				fmt.Fprintf(os.Stderr, "writer %d after %d operations: %v\nits last operations:\n  %s\n",
					id, i, err, strings.Join(m.hist, "\n  "))
				return 1
			}
			continue
		}
		o := m.next()
		if o.Op == "" {
			continue
		}
		if err := do(o); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED) {
				return 3
			}
			return 1
		}
		i++
	}
	// A last look at everything.
	for p := range m.ents {
		if err := m.checkPath(root, p); err != nil {
			fmt.Fprintf(os.Stderr, "writer %d at the end: %v\n", id, err)
			return 1
		}
	}
	fmt.Printf("writer %d: %d operations\n", id, nops)
	return 0
}
