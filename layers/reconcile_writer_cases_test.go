package layers_test

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// The minimized cases TestReconcileCutWhileAnotherWriterChanges found
// (a review on 2026-11-28), as a small language: the sandbox's history
// through the layers API, the journal cut after the records of the
// first cut operations, the other writer's changes, a commit; against
// the same with the whole journal and a clean stop. Each failed on the
// code it was found on (the commit went through where the whole journal
// refused, or made another tree; "lost rmdir of a directory the
// original moved a directory into" removed the other writer's files).

var flagWriterCase = flag.String("writer.case", "", "TestReconcileWriterCases: the cases whose name holds this")

// sbxOp runs one operation of the sandbox's: "write p data", "chmod p
// octal", "create p", "mkdir p", "symlink p", "unlink p", "rmdir p",
// "mv p q", "link p q".
func sbxOp(t *testing.T, l *layers.Layers, op string) {
	f := strings.Fields(op)
	c := layers.Caller{Pid: 1}
	look := func(p string) layers.Entry {
		if p == "" {
			return lookPath(t, l)
		}
		return lookPath(t, l, strings.Split(p, "/")...)
	}
	p := f[1]
	d, n := layers.Split(p)
	switch f[0] {
	case "write":
		e := look(p)
		fd, _, err := l.Open(p, &e.Obj, unix.O_WRONLY|unix.O_TRUNC, c)
		require.NoError(t, err, op)
		_, err = unix.Write(fd, []byte(f[2]))
		require.NoError(t, err)
		unix.Close(fd)
	case "chmod":
		m, err := strconv.ParseUint(f[2], 8, 32)
		require.NoError(t, err)
		mode := uint32(m)
		e := look(p)
		_, err = l.Setattr(p, &e.Obj, -1, layers.SetAttr{Mode: &mode}, c)
		require.NoError(t, err, op)
	case "create":
		fd, _, err := l.Create(d, look(d).Obj, n, 0o644, c)
		require.NoError(t, err, op)
		unix.Write(fd, []byte("new"))
		unix.Close(fd)
	case "mkdir":
		_, err := l.Mkdir(d, look(d).Obj, n, 0o755, c)
		require.NoError(t, err, op)
	case "symlink":
		_, err := l.Symlink(d, look(d).Obj, n, "t", c)
		require.NoError(t, err, op)
	case "unlink":
		require.NoError(t, l.Unlink(d, look(d).Obj, n, c), op)
	case "rmdir":
		require.NoError(t, l.Rmdir(d, look(d).Obj, n, c), op)
	case "mv":
		td, tn := layers.Split(f[2])
		e := look(p)
		require.NoError(t, l.Rename(d, look(d).Obj, n, &e.Obj, td, look(td).Obj, tn, 0, c), op)
	case "link":
		td, tn := layers.Split(f[2])
		e := look(p)
		_, err := l.Link(p, &e.Obj, td, look(td).Obj, tn, c)
		require.NoError(t, err, op)
	default:
		t.Fatalf("unknown op %q", op)
	}
}

// writerCase runs hist in a fresh sandbox over files (a trailing "/": a
// directory), keeps the records of the first keep operations (cut;
// -1: the whole journal, a clean stop), has the writer make its changes
// and commits. It returns the commit's error and the original before
// and after it.
func writerCase(t *testing.T, files []string, hist []string, keep int, writer []wAction) (error, map[string]string, map[string]string) {
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	for _, d := range []string{cfg.Upper, cfg.Work, cfg.Lowers[0]} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	for _, f := range files {
		full := filepath.Join(cfg.Lowers[0], f)
		if strings.HasSuffix(f, "/") {
			require.NoError(t, os.MkdirAll(full, 0o755))
			continue
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(filepath.Base(f)), 0o644))
	}
	time.Sleep(15 * time.Millisecond)
	l, err := layers.Open(cfg)
	require.NoError(t, err)
	jp := filepath.Join(cfg.Work, "journal")
	var size int64
	for i, op := range hist {
		if i == keep {
			require.NoError(t, l.Journal().Sync())
			st, err := os.Stat(jp)
			require.NoError(t, err)
			size = st.Size()
		}
		sbxOp(t, l, op)
	}
	require.NoError(t, l.Close())
	if keep >= 0 {
		if keep < len(hist) {
			require.NoError(t, os.Truncate(jp, size))
		}
		require.NoError(t, os.WriteFile(jp+".server", []byte("v1 the-boot-before 1 1\n"), 0o600))
	}
	time.Sleep(15 * time.Millisecond)
	var held []int
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	for _, a := range writer {
		require.NoError(t, a.apply(cfg.Lowers[0], &held), a.String())
	}
	before := treeOf(t, cfg.Lowers[0])
	x, err := commit.Prepare(cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	return err, before, treeOf(t, cfg.Lowers[0])
}

// TestReconcileWriterCases: each case must refuse with the cut where it
// refuses with the whole journal.
func TestReconcileWriterCases(t *testing.T) {
	for _, c := range []struct {
		name   string
		files  []string
		hist   []string
		keep   int
		writer []wAction
	}{
		{"lost write of a file the original removed", []string{"x"},
			[]string{"write x sbx"}, 0, []wAction{{Kind: "unlink", Path: "x"}}},
		{"lost chmod of a file the original removed", []string{"x"},
			[]string{"chmod x 700"}, 0, []wAction{{Kind: "unlink", Path: "x"}}},
		{"lost write of a file the original moved", []string{"x"},
			[]string{"write x sbx"}, 0, []wAction{{Kind: "rename", Path: "x", To: "y"}}},
		{"lost symlink in a directory the original removed", []string{"d/z"},
			[]string{"symlink d/m"}, 0, []wAction{{Kind: "rmr", Path: "d"}}},
		{"lost chmod of a directory the original removed", []string{"d/z"},
			[]string{"chmod d 700"}, 0, []wAction{{Kind: "rmr", Path: "d"}}},
		{"lost rmdir of a directory the original chmodded", []string{"d/"},
			[]string{"rmdir d"}, 0, []wAction{{Kind: "chmod", Path: "d", Mode: 0o750}}},
		{"lost mv of a file the original removed", []string{"x"},
			[]string{"mv x y"}, 0, []wAction{{Kind: "unlink", Path: "x"}}},
		{"lost mv of a directory the original moved", []string{"c/w"},
			[]string{"mv c n"}, 0, []wAction{{Kind: "rename", Path: "c", To: "o"}}},
		{"lost unlink in a directory the original removed (another tree)", []string{"c/w"},
			[]string{"unlink c/w"}, 0, []wAction{{Kind: "rmr", Path: "c"}}},
		{"lost rmdir of a directory the original moved a directory into", []string{"e/", "a/x"},
			[]string{"rmdir e"}, 0, []wAction{{Kind: "rename", Path: "a", To: "e/b"}}},
	} {
		if *flagWriterCase != "" && !strings.Contains(c.name, *flagWriterCase) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			refErr, _, refAfter := writerCase(t, c.files, c.hist, -1, c.writer)
			cutErr, before, after := writerCase(t, c.files, c.hist, c.keep, c.writer)
			t.Logf("reference: %v\ncut: %v\nwhat the cut's commit did to the writer's original: %q", refErr, cutErr, diffMaps(before, after))
			switch {
			case refErr != nil && cutErr == nil:
				t.Errorf("the cut went through where the whole journal refused")
			case refErr == nil && cutErr == nil && len(diffMaps(refAfter, after)) > 0:
				t.Errorf("the cut gave another tree: %q", diffMaps(refAfter, after))
			}
		})
	}
}
