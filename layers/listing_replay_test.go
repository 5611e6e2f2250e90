package layers

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

var (
	flagListingMinimize = flag.String("listing.minimize", "", "TestListingMinimize: a file of a failing history's lines, minimized on -listing.seed's original")
	flagListingFailure  = flag.String("listing.failure", "", "TestListingMinimize: keep the failures that say this (default: any)")
)

// replayOp runs one operation as a history line describes it (revOp,
// listingOp); false when it could not.
func replayOp(s *stack, line string) bool {
	f := strings.Fields(line)
	if len(f) < 2 {
		return false
	}
	look := func(p string) (Entry, bool) {
		e, err := s.lookup(p)
		return e, err == nil
	}
	parent := func(p string) (string, string, Obj, bool) {
		d, n := Split(p)
		e, ok := look(d)
		return d, n, e.Obj, ok && e.IsDir()
	}
	p := f[1]
	if f[0] == "unreported:" {
		// An operation that failed after its record: replayed as
		// it was, failing again.
		if len(f) < 5 || f[1] != "rename" {
			return false
		}
		a, _ := strconv.Unquote(f[2])
		b, _ := strconv.Unquote(f[3])
		fl, _ := strconv.ParseUint(f[4], 10, 32)
		e, ok := look(a)
		d, n, o, pok := parent(a)
		td, tn, to, tok := parent(b)
		if !ok || !pok || !tok {
			return false
		}
		s.Rename(d, o, n, &e.Obj, td, to, tn, uint32(fl)&unix.RENAME_EXCHANGE, s.c)
		return true
	}
	// As the kernel does, nothing is made where something is, and no
	// rename is asked that it refuses itself (revOp's checks).
	if _, exists := look(p); exists == (f[0] == "create" || f[0] == "mkdir" || f[0] == "symlink" || f[0] == "mkfifo") &&
		f[0] != "rm" && f[0] != "tmpfile" {
		return false
	}
	switch f[0] {
	case "write":
		if e, ok := look(p); !ok || e.Stat.Mode&unix.S_IFMT != unix.S_IFREG {
			return false
		}
		s.write(p, "w")
		return true
	case "create":
		d, n, o, ok := parent(p)
		if !ok {
			return false
		}
		fd, _, err := s.Create(d, o, n, 0o644, s.c)
		if err != nil {
			return false
		}
		unix.Write(fd, []byte("new"))
		return unix.Close(fd) == nil
	case "mkdir":
		d, n, o, ok := parent(p)
		if !ok {
			return false
		}
		_, err := s.Mkdir(d, o, n, 0o755, s.c)
		return err == nil
	case "rmdir", "unlink":
		d, n, o, ok := parent(p)
		if !ok {
			return false
		}
		if f[0] == "rmdir" {
			return s.Rmdir(d, o, n, s.c) == nil
		}
		if e, err := s.lookup(p); err != nil || e.IsDir() {
			return false // the kernel refuses unlink(2) of a directory (EISDIR) before it asks
		}
		return s.Unlink(d, o, n, s.c) == nil
	case "rm": // rm -r p
		if len(f) < 3 {
			return false
		}
		if _, ok := look(f[2]); !ok {
			return false
		}
		var rm func(p string) bool
		rm = func(p string) bool {
			e, ok := look(p)
			d, n, o, pok := parent(p)
			if !ok || !pok {
				return false
			}
			if e.IsDir() {
				for _, c := range s.names(p) {
					if !rm(Join(p, c)) {
						return false
					}
				}
				return s.Rmdir(d, s.dir(d), n, s.c) == nil
			}
			return s.Unlink(d, o, n, s.c) == nil
		}
		return rm(f[2])
	case "rename", "mvback":
		if len(f) < 3 {
			return false
		}
		flags := uint64(0)
		if len(f) > 3 {
			flags, _ = strconv.ParseUint(f[3], 10, 32)
		}
		e, ok := look(p)
		d, n, o, pok := parent(p)
		q := f[2]
		td, tn, to, tok := parent(q)
		if !ok || !pok || !tok || q == p || strings.HasPrefix(q, p+"/") || strings.HasPrefix(p, q+"/") {
			return false
		}
		if te, exists := look(q); exists && (te.Stat.Ino == e.Stat.Ino || flags == 0 && te.IsDir() != e.IsDir()) || !exists && flags != 0 {
			return false
		}
		return s.Rename(d, o, n, &e.Obj, td, to, tn, uint32(flags), s.c) == nil
	case "chmod":
		e, ok := look(p)
		mode := uint32(0o700)
		if !ok {
			return false
		}
		_, err := s.Setattr(p, &e.Obj, -1, SetAttr{Mode: &mode}, s.c)
		return err == nil
	case "chown", "truncate":
		e, ok := look(p)
		if !ok || len(f) < 3 {
			return false
		}
		v, _ := strconv.ParseUint(f[2], 10, 32)
		a := SetAttr{}
		uid, size := uint32(v), v
		if f[0] == "chown" {
			a.Uid = &uid
		} else {
			a.Size = &size
		}
		_, err := s.Setattr(p, &e.Obj, -1, a, s.c)
		return err == nil
	case "link":
		e, ok := look(p)
		if _, exists := look(f[2]); !ok || len(f) < 3 || exists || e.IsDir() {
			return false
		}
		td, tn, to, tok := parent(f[2])
		if !tok {
			return false
		}
		_, err := s.Link(p, &e.Obj, td, to, tn, s.c)
		return err == nil
	case "symlink":
		d, n, o, ok := parent(p)
		if !ok {
			return false
		}
		_, err := s.Symlink(d, o, n, "t", s.c)
		return err == nil
	case "setxattr", "removexattr":
		e, ok := look(p)
		if !ok || len(f) < 3 {
			return false
		}
		if f[0] == "setxattr" {
			return s.Setxattr(p, &e.Obj, f[2], []byte("v1"), 0, s.c) == nil
		}
		return s.Removexattr(p, &e.Obj, f[2], s.c) == nil
	case "mkfifo":
		d, n, o, ok := parent(p)
		if !ok {
			return false
		}
		_, err := s.Mknod(d, o, n, unix.S_IFIFO|0o644, 0, s.c)
		return err == nil
	case "tmpfile": // tmpfile linked at p
		if len(f) < 4 {
			return false
		}
		d, n, o, ok := parent(f[3])
		if _, exists := look(f[3]); !ok || exists {
			return false
		}
		fd, _, err := s.Tmpfile(d, o, 0o644, s.c)
		if err != nil {
			return false
		}
		defer unix.Close(fd)
		unix.Write(fd, []byte("tmp"))
		_, err = s.LinkFd(fd, d, o, n, s.c)
		return err == nil
	}
	return false
}

// TestListingMinimize cuts a failing history (-listing.minimize, one
// line of the history a line) down to the lines it still fails with, by
// removing runs of lines while it does: a tool for a failure of
// TestListingMatchesTheTrees, not a test.
func TestListingMinimize(t *testing.T) {
	if *flagListingMinimize == "" {
		t.Skip("no -listing.minimize")
	}
	b, err := os.ReadFile(*flagListingMinimize)
	if err != nil {
		t.Fatal(err)
	}
	var hist []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			hist = append(hist, l)
		}
	}
	dir := t.TempDir()
	runs := 0
	fails := func(h []string) bool {
		runs++
		bad, _ := listingRun(t, filepath.Join(dir, fmt.Sprint(runs)), *flagListingSeed, h)
		return slices.ContainsFunc(bad, func(b string) bool {
			return !strings.HasPrefix(b, "listing:") && strings.Contains(b, *flagListingFailure)
		})
	}
	if !fails(hist) {
		t.Fatal("the history does not fail")
	}
	for n := len(hist) / 2; n >= 1; n /= 2 {
		for i := 0; i < len(hist); {
			try := append(append([]string{}, hist[:i]...), hist[min(i+n, len(hist)):]...)
			if fails(try) {
				hist = try
			} else {
				i += n
			}
		}
	}
	bad, _ := listingRun(t, filepath.Join(dir, "last"), *flagListingSeed, hist)
	t.Logf("minimized to %d lines in %d runs:\n  %s\n%s", len(hist), runs, strings.Join(hist, "\n  "), strings.Join(bad, "\n"))
}
