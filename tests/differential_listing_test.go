package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
	exists := func(root, p string) bool {
		_, err := os.Lstat(filepath.Join(root, p))
		return err == nil
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
