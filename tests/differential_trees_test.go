package tests

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Operation set 3: whole trees removed and made again, as git checkout
// removes the files of a directory (and the directory) and writes them
// back at another commit. With renames of directories in between, a
// path can name the original's directory, then one moved there, then a
// new one: the change set must follow each (a new directory where a
// moved one was removed was taken for the moved one: ErrOriginalChanging
// on every read).
var diffOps3 = []weightedOp{{2, opRemoveTree}, {2, opRemakeTree}}

var flagDiffChurn = flag.Bool("diff.churn", false, "the differential tests draw only from operations that move, remove and make names "+
	"(renames, trees removed and made again, links), with some writes: histories that stress the change set's rename lineage")

// diffChurnOps are the operations of -diff.churn.
var diffChurnOps = []weightedOp{
	{16, opRename}, {6, opMkdir}, {4, opRmdir}, {6, opUnlink}, {6, opCreate}, {5, opRemoveTree}, {5, opRemakeTree},
	{3, opLink}, {2, opSymlink}, {3, opWriteAt}, {1, opChmod},
}

// opRemoveTree removes a directory with everything beneath it (rm -rf).
func opRemoveTree(r *diffRun) diffOp {
	rel := r.existing(isDirEnt)
	var tree []diffEnt
	var drops []string
	for _, e := range r.ents {
		if e.rel == rel || strings.HasPrefix(e.rel, rel+"/") {
			tree = append(tree, e)
			if !isDirEnt(e) {
				drops = append(drops, e.rel)
			}
		}
	}
	if len(tree) > 0 && len(r.removed) < 16 {
		r.removed = append(r.removed, tree)
	}
	return diffOp{desc: fmt.Sprintf("rm -rf %q", rel), do: func(root string) (any, error) {
		return nil, os.RemoveAll(filepath.Join(root, rel))
	}, drops: drops}
}

// opRemakeTree makes a tree opRemoveTree removed again where it was: its
// directories (mkdir -p) and regular files (new content), in the order
// they were listed.
func opRemakeTree(r *diffRun) diffOp {
	if len(r.removed) == 0 {
		return opMkdir(r)
	}
	tree := r.removed[r.rng.Intn(len(r.removed))]
	var parts []string
	for _, e := range tree {
		if isFileEnt(e) {
			parts = append(parts, e.rel)
		}
	}
	return diffOp{desc: fmt.Sprintf("remake %q (%d entries)", tree[0].rel, len(tree)), do: func(root string) (any, error) {
		for _, e := range tree {
			p := filepath.Join(root, e.rel)
			switch {
			case isDirEnt(e):
				if err := os.MkdirAll(p, 0o755); err != nil {
					return nil, err
				}
			case isFileEnt(e):
				// O_NONBLOCK: a FIFO made there since must not block.
				fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
				if err != nil {
					return nil, err
				}
				_, err = unix.Write(fd, []byte("remade "+e.rel+"\n"))
				unix.Close(fd)
				if err != nil {
					return nil, err
				}
			}
		}
		return nil, nil
	}, parts: parts}
}
