package tests

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// checkListing holds what `sbxfs status --json` lists against the
// original and the mount: a removal names a path the original has, once,
// and one the mount no longer shows unless another entry says what is
// there now (a new object, or one moved there beneath a renamed
// directory); a rename moves a path of the original to a path of the
// mount; every other entry is a path of the mount. The differential tests
// run it where they check the patch.
func (r *diffRun) checkListing() {
	r.t.Helper()
	out := r.cliOutput("status", "--json", r.sb.mnt)
	var st struct {
		Changes []layers.Change `json:"changes"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		r.fail("", "sbxfs status --json: %v\n%s", err, out)
	}
	listed := map[string]bool{} // paths of entries other than removals
	var renamedTo []string
	for _, c := range st.Changes {
		if c.Kind != layers.Deleted {
			listed[c.Path] = true
		}
		if c.Kind == layers.Renamed {
			renamedTo = append(renamedTo, c.Path)
		}
	}
	beneathRename := func(p string) bool {
		for _, q := range renamedTo {
			if q == "" || strings.HasPrefix(p, q+"/") {
				return true
			}
		}
		return false
	}
	// exists reports whether the tree at root has p, never through a
	// symlink: a directory replaced by a symlink holds nothing.
	exists := func(root, p string) bool {
		parts := strings.Split(p, "/")
		for i := range parts {
			st, err := os.Lstat(filepath.Join(root, filepath.Join(parts[:i+1]...)))
			if err != nil || i < len(parts)-1 && !st.IsDir() {
				return false
			}
		}
		return true
	}
	removed := map[string]bool{}
	var bad []string
	for _, c := range st.Changes {
		switch c.Kind {
		case layers.Deleted:
			switch {
			case removed[c.Path]:
				bad = append(bad, fmt.Sprintf("D %q: listed twice", c.Path))
			case !exists(r.sb.orig, c.Path):
				bad = append(bad, fmt.Sprintf("D %q: the original has no such path", c.Path))
			case exists(r.sb.mnt, c.Path) && !listed[c.Path] && !beneathRename(c.Path):
				bad = append(bad, fmt.Sprintf("D %q: the mount still shows it, and no entry says what is there now", c.Path))
			}
			removed[c.Path] = true
		case layers.Renamed:
			if !exists(r.sb.orig, c.From) || !exists(r.sb.mnt, c.Path) {
				bad = append(bad, fmt.Sprintf("R %q -> %q: the original has no such source, or the mount no such target", c.From, c.Path))
			}
		default:
			if !exists(r.sb.mnt, c.Path) {
				bad = append(bad, fmt.Sprintf("%s %q: the mount has no such path", c.Kind, c.Path))
			}
		}
	}
	if len(bad) > 0 {
		r.fail("", "sbxfs status lists what is not so:\n  %s", strings.Join(bad[:min(len(bad), 20)], "\n  "))
	}
}

// checkDiffCoverage holds `sbxfs diff --json` and `sbxfs status --json`
// to the two trees themselves: every path where the mount shows
// something other than the original (an object only one of them has, or
// another type, permission bits, owner, content, symlink target, device
// number or user.* attribute) must be named by an entry, as its path,
// its rename source or its old path. In the diff a file a renamed
// directory moves needs an entry of its own (git names each), in status
// the rename names everything beneath it; in both a directory beneath a
// renamed one is shown by the rename. The differential tests run it with
// checkListing.
func (r *diffRun) checkDiffCoverage() {
	r.t.Helper()
	out := r.cliOutput("diff", "--json", r.sb.mnt)
	var d struct {
		Changes []commit.FileDiff `json:"changes"`
	}
	if err := json.Unmarshal(out, &d); err != nil {
		r.fail("", "sbxfs diff --json: %v\n%s", err, out)
	}
	diff := coverage{named: map[string]bool{}}
	for _, f := range d.Changes {
		diff.add(b64Or(f.Path, f.PathB64, r.t), b64Or(f.From, f.FromB64, r.t), f.Type)
		if f.OldPath != "" || f.OldPathB64 != "" {
			diff.named[b64Or(f.OldPath, f.OldPathB64, r.t)] = true
		}
	}
	out = r.cliOutput("status", "--json", r.sb.mnt)
	var st struct {
		Changes []struct {
			Path    string `json:"path"`
			PathB64 string `json:"path_b64"`
			From    string `json:"from"`
			FromB64 string `json:"from_b64"`
			Type    string `json:"type"`
		} `json:"changes"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		r.fail("", "sbxfs status --json: %v\n%s", err, out)
	}
	status := coverage{named: map[string]bool{}, filesBeneathRenames: true}
	for _, c := range st.Changes {
		status.add(b64Or(c.Path, c.PathB64, r.t), b64Or(c.From, c.FromB64, r.t), c.Type)
	}
	opts := walkOpts{xattr: userXattrs, owner: true}
	orig, err := walkTree(r.sb.orig, opts)
	if err != nil {
		r.t.Fatal(err)
	}
	mnt, err := walkTree(r.sb.mnt, opts)
	if err != nil {
		r.fail("", "walk the mount: %v", err)
	}
	for _, c := range []struct {
		what string
		cov  coverage
	}{{"sbxfs diff --json", diff}, {"sbxfs status --json", status}} {
		if bad := c.cov.missing(orig, mnt); len(bad) > 0 {
			r.fail("", "%s names no change at paths where the mount differs from the original:\n  %s", c.what, strings.Join(bad[:min(len(bad), 20)], "\n  "))
		}
	}
}

// coverage is what a listing names: paths, and the two ends of each
// directory rename.
type coverage struct {
	named               map[string]bool
	renamedDirs         []string
	filesBeneathRenames bool // a rename names what is beneath it
}

func (c *coverage) add(p, from, typ string) {
	c.named[p] = true
	if from != "" {
		c.named[from] = true
		if typ == "dir" {
			c.renamedDirs = append(c.renamedDirs, from, p)
		}
	}
}

// missing lists the paths where the trees differ that c does not name.
func (c *coverage) missing(orig, mnt map[string]nodeInfo) []string {
	beneathRenamedDir := func(p string) bool {
		for _, q := range c.renamedDirs {
			if q == "" || strings.HasPrefix(p, q+"/") {
				return true
			}
		}
		return false
	}
	var bad []string
	check := func(p string) {
		o, inOrig := orig[p]
		m, inMnt := mnt[p]
		if inOrig && inMnt && sameObject(o, m) || c.named[p] {
			return
		}
		dirOrNone := func(n nodeInfo, in bool) bool { return !in || n.Type == unix.S_IFDIR }
		if (c.filesBeneathRenames || dirOrNone(o, inOrig) && dirOrNone(m, inMnt)) && beneathRenamedDir(p) {
			return
		}
		bad = append(bad, fmt.Sprintf("%q: original %s, mount %s", p, describe(o, inOrig), describe(m, inMnt)))
	}
	for p := range orig {
		check(p)
	}
	for p := range mnt {
		if _, ok := orig[p]; !ok {
			check(p)
		}
	}
	slices.Sort(bad)
	return bad
}

// sameObject reports whether two objects look the same to a user: type,
// permission bits, owner, content, target, device number and attributes.
func sameObject(a, b nodeInfo) bool {
	return a.Type == b.Type && (a.Perm == b.Perm || a.Type == unix.S_IFLNK) && a.Uid == b.Uid && a.Gid == b.Gid &&
		a.Hash == b.Hash && a.Target == b.Target && a.Rdev == b.Rdev && maps.Equal(a.Xattrs, b.Xattrs)
}

func describe(n nodeInfo, exists bool) string {
	if !exists {
		return "none"
	}
	return fmt.Sprintf("%s %04o %d:%d", fileTypeName(n.Type), n.Perm, n.Uid, n.Gid)
}
