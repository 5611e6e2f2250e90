package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// closeInto closes an instance, keeping the first error.
func closeInto(in *instance, err *error) {
	if cerr := in.close(); cerr != nil && *err == nil {
		*err = cerr
	}
}

// cold makes an instance cold: a fresh mount (so a FUSE server starts with
// no nodes and the kernel with no dentries of it) and no page cache.
func (e *env) cold(in *instance) error {
	if err := in.remount(); err != nil {
		return err
	}
	return e.dropCaches(3)
}

// medianOf runs fn n times and returns the median time.
func medianOf(n int, fn func() (float64, error)) (float64, error) {
	var ts []float64
	for i := 0; i < n; i++ {
		t, err := fn()
		if err != nil {
			return 0, err
		}
		ts = append(ts, t)
	}
	sort.Float64s(ts)
	return ts[len(ts)/2], nil
}

// benchMetadata: find and stat of every file, cold and warm.
func (e *env) benchMetadata(t *target, rep int) (err error) {
	orig, err := e.need("meta")
	if err != nil {
		return err
	}
	in, err := e.open(t, orig, readOnly)
	if err != nil {
		return err
	}
	defer closeInto(in, &err)
	find := func() (float64, error) { return e.timeCmd("", nil, "find", in.path) }
	stat := func() (float64, error) { return timeFn(func() error { return e.statAll(in.path, e.metaFiles) }) }
	for _, m := range []struct {
		name string
		fn   func() (float64, error)
	}{{"find", find}, {"stat", stat}} {
		if err := e.cold(in); err != nil {
			return err
		}
		d, err := m.fn()
		if err != nil {
			return err
		}
		e.res.add("metadata", m.name+".cold", t.name, d)
		if d, err = medianOf(3, m.fn); err != nil {
			return err
		}
		e.res.add("metadata", m.name+".warm", t.name, d)
	}
	return nil
}

// statAll lstats every file (a lookup of each name, then its attributes).
func (e *env) statAll(root string, files []string) error {
	var st unix.Stat_t
	for i, f := range files {
		if i%1024 == 0 && e.ctx.Err() != nil {
			return e.ctx.Err()
		}
		if err := unix.Lstat(root+"/"+f, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", f, err)
		}
	}
	return nil
}

// benchSmallFiles: extract the tarball into a new directory of the mount,
// then rm -rf it.
func (e *env) benchSmallFiles(t *target, rep int) (err error) {
	orig, err := e.need("empty")
	if err != nil {
		return err
	}
	tarball, err := e.need("tar")
	if err != nil {
		return err
	}
	in, err := e.open(t, orig, writeNew)
	if err != nil {
		return err
	}
	defer closeInto(in, &err)
	dst := filepath.Join(in.path, fmt.Sprintf("untar-%d", e.seq))
	if t.onTree() {
		defer os.RemoveAll(dst) // the original itself: leave it as it was
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	if _, err := readAll(tarball); err != nil { // the tarball is read from the page cache
		return err
	}
	unix.Sync()
	d, err := e.timeCmd("", nil, "tar", "-xf", tarball, "-C", dst)
	if err != nil {
		return err
	}
	e.res.add("smallfiles", "untar", t.name, d)
	unix.Sync() // the extraction's writeback is not rm's
	if d, err = e.timeCmd("", nil, "rm", "-rf", dst); err != nil {
		return err
	}
	e.res.add("smallfiles", "rm", t.name, d)
	return nil
}

// benchCopyUp appends one byte to every file of the copy-up original
// (each append copies the file up, on the overlays).
func (e *env) benchCopyUp(t *target, rep int) (err error) {
	orig, err := e.need("copyup")
	if err != nil {
		return err
	}
	in, err := e.open(t, orig, modify)
	if err != nil {
		return err
	}
	defer closeInto(in, &err)
	src := orig
	if t.onTree() {
		src = in.tree
	}
	for _, f := range e.copyupFiles { // their data in the page cache: copy-up, not disk reads, is measured
		if _, err := os.ReadFile(filepath.Join(src, f)); err != nil {
			return err
		}
	}
	unix.Sync()
	d, err := timeFn(func() error {
		for _, f := range e.copyupFiles {
			fd, err := unix.Open(filepath.Join(in.path, f), unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s: %w", f, err)
			}
			_, err = unix.Write(fd, []byte{'x'})
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("append to %s: %w", f, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	e.res.add("copyup", "append", t.name, d)
	return nil
}

// benchData: sequential write with fsync, cold reads, fio random reads.
func (e *env) benchData(t *target, rep int) (err error) {
	orig, err := e.need("data")
	if err != nil {
		return err
	}
	in, err := e.open(t, orig, writeNew)
	if err != nil {
		return err
	}
	defer closeInto(in, &err)
	seq := filepath.Join(in.path, fmt.Sprintf("seq-%d.bin", e.seq))
	rnd := filepath.Join(in.path, fmt.Sprintf("rand-%d.bin", e.seq))
	if t.onTree() {
		defer os.Remove(seq)
		defer os.Remove(rnd)
	}
	size := float64(e.sz.dataMiB) * mib
	unix.Sync()
	d, err := timeFn(func() error { return writeBig(seq, e.sz.dataMiB, true) })
	if err != nil {
		return err
	}
	e.res.add("data", "seqwrite", t.name, size/d)
	// Writes of 4 KiB, as stdio-buffered programs make: a cost a write
	// (not a MiB) shows here.
	small := filepath.Join(in.path, fmt.Sprintf("small-%d.bin", e.seq))
	d, err = timeFn(func() error { return writeChunked(small, e.sz.smallMiB, 4096, true) })
	if err != nil {
		return err
	}
	e.res.add("data", "smallwrite", t.name, float64(e.sz.smallMiB)*mib/d)
	if err := os.Remove(small); err != nil {
		return err
	}
	for _, r := range []struct{ row, path string }{{"readback", seq}, {"readorig", filepath.Join(in.path, "big.bin")}} {
		if err := e.dropCaches(3); err != nil {
			return err
		}
		var n int64
		d, err := timeFn(func() (err error) { n, err = readAll(r.path); return err })
		if err != nil {
			return err
		}
		if n != int64(size) {
			return fmt.Errorf("read %d bytes of %s, expected %d", n, r.path, int64(size))
		}
		e.res.add("data", r.row, t.name, size/d)
	}
	if err := os.Remove(seq); err != nil {
		return err
	}
	if err := e.dropCaches(3); err != nil {
		return err
	}
	iops, err := e.fioRandRead(filepath.Join(in.path, "rand.bin"))
	if err != nil {
		return err
	}
	e.res.add("data", "randorig", t.name, iops)
	if err := writeBig(rnd, e.sz.randMiB, true); err != nil {
		return err
	}
	if err := e.dropCaches(3); err != nil {
		return err
	}
	if iops, err = e.fioRandRead(rnd); err != nil {
		return err
	}
	e.res.add("data", "randnew", t.name, iops)
	return os.Remove(rnd)
}

// readAll reads a file in 1 MiB reads and returns its length.
func readAll(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		m, err := f.Read(buf)
		n += int64(m)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// fioRandRead runs fio's 4 KiB random reads (buffered, one job) over the
// whole existing file, bounded in time, and returns the IOPS.
func (e *env) fioRandRead(path string) (float64, error) {
	out := filepath.Join(e.work, "fio.json")
	defer os.Remove(out)
	_, err := e.output("", nil, "fio", "--name=randread", "--filename="+path, "--readonly",
		"--rw=randread", "--bs=4k", fmt.Sprintf("--size=%dm", e.sz.randMiB), "--ioengine=psync",
		"--direct=0", fmt.Sprintf("--runtime=%d", e.sz.randRuntime),
		"--output-format=json", "--output="+out)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return 0, err
	}
	if i := strings.IndexByte(string(b), '{'); i > 0 { // fio may print notes before the JSON
		b = b[i:]
	}
	var r struct {
		Jobs []struct {
			Read struct {
				IOPS float64 `json:"iops"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, fmt.Errorf("fio output: %w", err)
	}
	if len(r.Jobs) == 0 || r.Jobs[0].Read.IOPS <= 0 {
		return 0, errors.New("fio reported no reads")
	}
	return r.Jobs[0].Read.IOPS, nil
}
