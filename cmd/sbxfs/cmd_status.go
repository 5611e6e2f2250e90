package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "list the changes of a sandbox",
		ArgsUsage: "[MOUNTPOINT|DIR|ID]",
		Description: `Lists every path the sandbox changed, one per line:
  A path          created         D path         deleted
  M path          modified        R from -> path renamed
  m path          metadata only   L from -> path new hard link to from
then a summary line. A removal names the original path of what was
removed (mv d e; rm -r e lists D d and D d/f; mv y x; rm x lists D x and
D y), also of a file that went with a removed directory without a
removal of its own (the original's listings of removed or replaced
directories are read for it). A renamed directory is one entry ('sbxfs
diff --name-status' names each file it moves). Paths with control
characters or invalid UTF-8 are quoted as Go strings. A new directory
with more than 100 entries beneath it, all of them new (an npm install,
a clone, a build's output), is one line, 'A dir/ (N entries)', unless
--all; the summary line and --json count and list every entry. The sandbox is
named by its mountpoint, its sandbox directory DIR (with DIR/work), its
work directory, or the ID of a managed sandbox; without one, the sbxfs
mount the working directory lies in. --json prints the
layers, the mount and the changes; a path that is not valid UTF-8 also
comes base64-encoded in path_b64 (from_b64 for from).

After the changes come the conflicts, if any: paths the original changed
since the sandbox read them, which a commit would refuse on ('sbxfs
resolve' keeps the sandbox's version of one). --json lists them under
"conflicts".`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			&cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "list every entry of a large new directory instead of one line for it"},
		},
		OnUsageError: onUsageError,
		Action:       runStatus,
	}
}

// statusJSON is the --json output.
type statusJSON struct {
	Original   string       `json:"original"`
	Lowers     []string     `json:"lowers"`
	Upper      string       `json:"upper"`
	Work       string       `json:"work"`
	Mounted    bool         `json:"mounted"`
	Mountpoint string       `json:"mountpoint"`
	Changes    []changeJSON `json:"changes"`
	// The exact bytes of the paths above that are not valid UTF-8.
	OriginalB64   string   `json:"original_b64,omitempty"`
	LowersB64     []string `json:"lowers_b64,omitempty"` // one a layer ("" for a valid one), when any is not
	UpperB64      string   `json:"upper_b64,omitempty"`
	WorkB64       string   `json:"work_b64,omitempty"`
	MountpointB64 string   `json:"mountpoint_b64,omitempty"`
	// Conflicts are what a commit would refuse on now: paths the
	// original changed since the sandbox read them.
	Conflicts []commit.Conflict `json:"conflicts"`
}

type changeJSON struct {
	Path    string `json:"path"`
	PathB64 string `json:"path_b64,omitempty"`
	Kind    string `json:"kind"`
	From    string `json:"from,omitempty"`
	FromB64 string `json:"from_b64,omitempty"`
	Type    string `json:"type"`
}

func runStatus(c *cli.Context) error {
	args, err := argsOrHere(c)
	if err != nil {
		return err
	}
	sb, cs, err := sandboxChanges(c, args[0])
	if err != nil {
		return err
	}
	work, m := sb.work, sb.meta
	st := statusJSON{Original: m.Lowers[0], Lowers: m.Lowers, Upper: m.Upper, Work: work, Changes: []changeJSON{}}
	if sb.mount != nil {
		st.Mounted, st.Mountpoint = true, sb.mount.Mountpoint
	}
	st.OriginalB64, st.UpperB64, st.WorkB64 = fsutil.B64IfInvalid(st.Original), fsutil.B64IfInvalid(st.Upper), fsutil.B64IfInvalid(st.Work)
	st.MountpointB64 = fsutil.B64IfInvalid(st.Mountpoint)
	for i, l := range st.Lowers {
		if b := fsutil.B64IfInvalid(l); b != "" {
			if st.LowersB64 == nil {
				st.LowersB64 = make([]string, len(st.Lowers))
			}
			st.LowersB64[i] = b
		}
	}
	listing, err := commit.StatusListing(sb.cfg, cs)
	if err != nil {
		return fmt.Errorf("status of %s: %w", work, err)
	}
	for _, ch := range listing {
		st.Changes = append(st.Changes, toChangeJSON(ch))
	}
	conflicts, err := commit.ConflictsOf(sb.cfg, cs)
	if err != nil {
		return fmt.Errorf("look for conflicts of %s in %s: %w", work, m.Lowers[0], err)
	}
	st.Conflicts = append([]commit.Conflict{}, conflicts...)
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	collapse := collapseAbove
	if c.Bool("all") {
		collapse = 0
	}
	if err := printChanges(c.App.Writer, listing, collapse); err != nil {
		return err
	}
	printConflicts(c.App.Writer, conflicts, args[0])
	return nil
}

// printConflicts says what a commit would refuse on, and what to do.
func printConflicts(w io.Writer, conflicts []commit.Conflict, arg string) {
	switch len(conflicts) {
	case 0:
		return
	case 1:
		fmt.Fprintf(w, "1 conflict: a commit refuses it until 'sbxfs resolve %s PATH' keeps the sandbox's version (or 'sbxfs commit --force')\n", arg)
	default:
		fmt.Fprintf(w, "%d conflicts: a commit refuses them until 'sbxfs resolve %s PATH...' keeps the sandbox's version (or 'sbxfs commit --force')\n", len(conflicts), arg)
	}
	for _, r := range conflicts {
		fmt.Fprintf(w, "  %s: %s\n", quotePath(r.Path), r.Reason)
	}
}

// argsOrHere is the argument of status or diff: the one given, or else
// the sbxfs mount the working directory lies in (as git finds its
// repository).
func argsOrHere(c *cli.Context) ([]string, error) {
	args := c.Args().Slice()
	if len(args) > 0 {
		return args, checkArgs(c, args, 1, "MOUNTPOINT|DIR|ID")
	}
	wd := workingDir()
	mounts, err := fsutil.ReadMountinfo()
	if err != nil || wd == "" {
		return nil, failf(exitUsage, "%s needs MOUNTPOINT|DIR|ID (the working directory's mount could not be told: %v)", c.Command.Name, err)
	}
	e := fsutil.MountContaining(mounts, wd)
	if e == nil || !isSbxfs(e) {
		return nil, failf(exitUsage, "%s needs MOUNTPOINT|DIR|ID: the working directory %s is not in an sbxfs mount; see 'sbxfs help %s'", c.Command.Name, wd, c.Command.Name)
	}
	return []string{e.Mountpoint}, nil
}

// findSandbox returns the work directory of the sandbox arg names: an sbxfs
// mountpoint, a sandbox directory DIR (DIR/work) or a work directory.
func findSandbox(mounts []fsutil.MountEntry, arg string) (string, error) {
	p, err := resolveMountpoint(arg)
	if err != nil {
		return "", failf(exitBadPath, "%q: %v; give a mountpoint or a sandbox directory", arg, err)
	}
	e := fsutil.MountAt(mounts, p)
	if e != nil && isSbxfs(e) {
		return e.Source, nil
	}
	if msg := othersSbxfs(e); msg != "" {
		return "", failf(exitNotSbxfs, "%s", msg)
	}
	for _, work := range []string{filepath.Join(p, "work"), p} {
		if _, err := os.Stat(filepath.Join(work, layers.MetaFile)); err == nil {
			return work, nil
		}
	}
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return "", failf(exitBadPath, "%q does not exist; give a mountpoint or a sandbox directory", arg)
	}
	if e := fsutil.MountContaining(mounts, p); e != nil && isSbxfs(e) {
		return "", failf(exitNotSbxfs, "%s lies inside the sbxfs mount %s; give that mountpoint (sbxfs works on a whole sandbox)", p, e.Mountpoint)
	}
	return "", failf(exitNotSbxfs, "%s is not an sbxfs mount or sandbox directory; give the MOUNTPOINT or the --upper DIR of 'sbxfs mount'", p)
}

func toChangeJSON(ch layers.Change) changeJSON {
	return changeJSON{Path: ch.Path, PathB64: fsutil.B64IfInvalid(ch.Path), Kind: string(ch.Kind),
		From: ch.From, FromB64: fsutil.B64IfInvalid(ch.From), Type: ch.Type}
}

// kindLetters gives each kind its letter in the text output, in the order
// of the summary line.
var kindLetters = []struct {
	kind   layers.ChangeKind
	letter string
}{
	{layers.Created, "A"}, {layers.Modified, "M"}, {layers.Metadata, "m"},
	{layers.Deleted, "D"}, {layers.Renamed, "R"}, {layers.Linked, "L"},
}

func letterOf(k layers.ChangeKind) string {
	for _, kl := range kindLetters {
		if kl.kind == k {
			return kl.letter
		}
	}
	return "?"
}

// collapseAbove is how many entries a new directory holds, all new,
// before status shows it as one line (git shows every untracked
// directory so; small ones are listed whole here, as a new package of a
// few files is worth reading name by name, an npm install is not).
const collapseAbove = 100

// printChanges prints one line per change and a summary line. changes
// are in listing order (by path, byte-wise). A created directory with
// more than collapse entries beneath it, every one of them created, is
// printed as one line (collapse 0: never).
func printChanges(out io.Writer, changes []layers.Change, collapse int) error {
	w := bufio.NewWriter(out) // a line a change: one write(2), not thousands
	counts := map[layers.ChangeKind]int{}
	for _, ch := range changes {
		counts[ch.Kind]++
	}
	if !slices.IsSortedFunc(changes, func(a, b layers.Change) int { return strings.Compare(a.Path, b.Path) }) {
		collapse = 0 // newEntriesBeneath searches by path
	}
	skip := map[int]int{} // first index of a collapsed directory's entries -> past its last
	for i := 0; i < len(changes); i++ {
		if end, ok := skip[i]; ok {
			i = end - 1
			continue
		}
		ch := changes[i]
		line := letterOf(ch.Kind) + " " + quotePath(ch.Path)
		if ch.Kind == layers.Renamed || ch.Kind == layers.Linked {
			line = letterOf(ch.Kind) + " " + quotePath(ch.From) + " -> " + quotePath(ch.Path)
		}
		if collapse > 0 {
			if start, end := newEntriesBeneath(changes, i); end-start > collapse {
				line = fmt.Sprintf("A %s/ (%d entries)", quotePath(ch.Path), end-start)
				skip[start] = end
			}
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintln(w, summary(len(changes), counts)); err != nil {
		return err
	}
	return w.Flush()
}

// newEntriesBeneath returns the range of changes beneath changes[i] when
// it is a created directory and every one of them is a creation, else an
// empty range. (Byte-wise, d-x sorts between d and d/x: the entries
// beneath d follow it as one run, but not always at once.) A renamed or
// linked entry, a removal or a change of an original path beneath keeps
// the directory listed entry by entry, down to its wholly new
// subdirectories.
func newEntriesBeneath(changes []layers.Change, i int) (start, end int) {
	dir := changes[i]
	if dir.Kind != layers.Created || dir.Type != "dir" || dir.Path == "" {
		return 0, 0
	}
	prefix := dir.Path + "/"
	rest := changes[i+1:]
	start = i + 1 + sort.Search(len(rest), func(j int) bool { return rest[j].Path >= prefix })
	for end = start; end < len(changes) && strings.HasPrefix(changes[end].Path, prefix); end++ {
		if changes[end].Kind != layers.Created {
			return 0, 0
		}
	}
	return start, end
}

func summary(n int, counts map[layers.ChangeKind]int) string {
	if n == 0 {
		return "no changes"
	}
	var parts []string
	known := 0
	for _, kl := range kindLetters {
		if c := counts[kl.kind]; c > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c, kl.kind))
			known += c
		}
	}
	if n > known {
		parts = append(parts, fmt.Sprintf("%d other", n-known))
	}
	noun := "changes"
	if n == 1 {
		noun = "change"
	}
	return fmt.Sprintf("%d %s: %s", n, noun, strings.Join(parts, ", "))
}

// quotePath returns p as is, or quoted with strconv.Quote when it holds
// control characters or invalid UTF-8 (so one change stays on one line).
func quotePath(p string) string {
	if p == "" {
		return "." // the sandbox's root
	}
	if !utf8.ValidString(p) {
		return strconv.Quote(p)
	}
	for _, r := range p {
		if unicode.IsControl(r) {
			return strconv.Quote(p)
		}
	}
	return p
}
