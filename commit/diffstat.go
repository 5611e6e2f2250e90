package commit

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// statWidth is the line width DiffStat fits its lines in, as git does
// when its output is not a terminal.
const statWidth = 80

// statLine is one line of DiffStat. same: binary content that did not
// change (a rename), which git shows as "Bin" alone.
type statLine struct {
	key              listedKey
	name             string
	added, deleted   int
	binary, same     bool
	oldSize, newSize int64
}

// DiffStat writes `git diff --stat`-like lines (path | N +++--) and a
// summary line, sorted by path as git sorts them. It lists every change
// of a non-directory and, as git, the files a renamed directory moves
// (`{d => e}/f | 0`) rather than the directory; with nothing to list it
// writes nothing, as git.
func DiffStat(w io.Writer, cfg layers.Config, cs layers.ChangeSet) error {
	var lines []statLine
	err := eachDiffPair(cfg, cs, pairOpts{listing: true}, func(d *diffPair) error {
		if !d.old.exists && !d.new.exists || d.old.typ() == unix.S_IFDIR || d.new.typ() == unix.S_IFDIR {
			return nil
		}
		dc := d.content()
		l := statLine{key: keyOf(d), name: statName(d), binary: dc.binary, same: !dc.differs, oldSize: d.old.size, newSize: d.new.size}
		l.added, l.deleted = countLines(dc.script)
		lines = append(lines, l)
		return nil
	})
	if err != nil || len(lines) == 0 {
		return err
	}
	slices.SortStableFunc(lines, func(a, b statLine) int { return compareListed(a.key, b.key) })
	bw := bufio.NewWriter(w)
	writeStatLines(bw, lines)
	return bw.Flush()
}

func statName(d *diffPair) string {
	if d.oldPath != "" && d.newPath != "" && d.oldPath != d.newPath {
		return renameName(d.oldPath, d.newPath)
	}
	return gitQuote(d.c.Path)
}

// writeStatLines lays the lines out as git's show_stats does for an
// 80-column output.
func writeStatLines(w io.Writer, lines []statLine) {
	nameWidth, maxChange, binWidth := 0, 0, 0
	files, ins, dels := len(lines), 0, 0
	for _, l := range lines {
		nameWidth = max(nameWidth, utf8.RuneCountInString(l.name))
		if l.binary {
			binWidth = max(binWidth, len(binText(l)))
			continue
		}
		maxChange = max(maxChange, l.added+l.deleted)
		ins, dels = ins+l.added, dels+l.deleted
	}
	numWidth := len(strconv.Itoa(maxChange))
	if binWidth > 0 {
		numWidth = max(numWidth, 3)
	}
	graphWidth := maxChange
	if maxChange+4 <= binWidth {
		graphWidth = binWidth - 4
	}
	if nameWidth+numWidth+6+graphWidth > statWidth {
		if graphWidth > statWidth*3/8-numWidth-6 {
			graphWidth = max(statWidth*3/8-numWidth-6, 6)
		}
		if nameWidth > statWidth-numWidth-6-graphWidth {
			nameWidth = statWidth - numWidth - 6 - graphWidth
		} else {
			graphWidth = statWidth - numWidth - 6 - nameWidth
		}
	}
	for _, l := range lines {
		name := fitName(l.name, nameWidth)
		pad := strings.Repeat(" ", nameWidth-utf8.RuneCountInString(name))
		if l.binary {
			fmt.Fprintf(w, " %s%s | %s\n", name, pad, binText(l))
			continue
		}
		add, del := scaleGraph(l.added, l.deleted, graphWidth, maxChange)
		graph := ""
		if l.added+l.deleted > 0 {
			graph = " " + strings.Repeat("+", add) + strings.Repeat("-", del)
		}
		fmt.Fprintf(w, " %s%s | %*d%s\n", name, pad, numWidth, l.added+l.deleted, graph)
	}
	fmt.Fprintln(w, statSummary(files, ins, dels))
}

func binText(l statLine) string {
	if l.same {
		return "Bin"
	}
	return fmt.Sprintf("Bin %d -> %d bytes", l.oldSize, l.newSize)
}

// scaleGraph scales the +/- counts of a line to the graph width, as git:
// the total first, then the smaller part, the larger one taking the rest.
func scaleGraph(add, del, width, maxChange int) (int, int) {
	if width > maxChange {
		return add, del
	}
	total := scaleLinear(add+del, width, maxChange)
	if total < 2 && add > 0 && del > 0 {
		total = 2
	}
	if add < del {
		add = scaleLinear(add, width, maxChange)
		return add, total - add
	}
	del = scaleLinear(del, width, maxChange)
	return total - del, del
}

func scaleLinear(n, width, maxChange int) int {
	if n == 0 {
		return 0
	}
	return 1 + n*(width-1)/maxChange
}

// fitName shortens name to width runes as git does: "..." and the tail,
// cut at a slash when there is one.
func fitName(name string, width int) string {
	r := []rune(name)
	if len(r) <= width {
		return name
	}
	tail := string(r[len(r)-max(width-3, 0):])
	if i := strings.IndexByte(tail, '/'); i >= 0 {
		tail = tail[i:]
	}
	return "..." + tail
}

// statSummary is git's summary line.
func statSummary(files, ins, dels int) string {
	plural := func(n int, one, many string) string {
		if n == 1 {
			return one
		}
		return many
	}
	s := fmt.Sprintf(" %d %s changed", files, plural(files, "file", "files"))
	if ins > 0 || dels == 0 {
		s += fmt.Sprintf(", %d %s(+)", ins, plural(ins, "insertion", "insertions"))
	}
	if dels > 0 || ins == 0 {
		s += fmt.Sprintf(", %d %s(-)", dels, plural(dels, "deletion", "deletions"))
	}
	return s
}

// renameName is git's "a/{b => c}/d" form of a rename: the common
// leading directories and trailing components written once.
func renameName(a, b string) string {
	if gitQuote(a) != a || gitQuote(b) != b {
		return gitQuote(a) + " => " + gitQuote(b)
	}
	pfx := 0
	for i := 0; i < len(a) && i < len(b) && a[i] == b[i]; i++ {
		if a[i] == '/' {
			pfx = i + 1
		}
	}
	at := func(s string, i int) byte {
		if i < len(s) {
			return s[i]
		}
		return 0
	}
	adj := min(pfx, 1)
	sfx := 0
	for i, j := len(a), len(b); pfx-adj <= i && pfx-adj <= j && at(a, i) == at(b, j); i, j = i-1, j-1 {
		if at(a, i) == '/' {
			sfx = len(a) - i
		}
	}
	aMid, bMid := max(len(a)-pfx-sfx, 0), max(len(b)-pfx-sfx, 0)
	if pfx+sfx == 0 {
		return a + " => " + b
	}
	return a[:pfx] + "{" + a[pfx:pfx+aMid] + " => " + b[pfx:pfx+bMid] + "}" + a[len(a)-sfx:]
}

// NameStatus writes one line per change: `A\tpath` (created or a new
// hard link), `M\tpath`, `D\tpath`, `R\tfrom\tpath`, `T\tpath` (type
// change) or `m\tpath` (metadata only). Paths are quoted as in Diff. The
// change set does not record the original's type, so T is written only
// where the set proves a type change (a directory, fifo or socket that
// was modified), and a renamed directory is one line;
// NameStatusWithTypes reads the original.
func NameStatus(w io.Writer, cs layers.ChangeSet) error {
	bw := bufio.NewWriter(w)
	for _, c := range cs.Listing() {
		oldType := c.Type
		switch c.Type {
		case "dir", "fifo", "socket":
			oldType = "" // modified only by a change of type
		}
		if _, err := bw.WriteString(nameStatusLine(c, oldType) + "\n"); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// NameStatusWithTypes is NameStatus that reads the original: it tells
// type changes (T) from content changes (M) by the original's object of
// each modified path (one lstat each), and lists with a renamed
// directory the files that move with it (`R\td/f\te/f`, as git names
// them) and the original files it drops (`D`), sorted by path as git
// sorts them.
func NameStatusWithTypes(w io.Writer, cfg layers.Config, cs layers.ChangeSet) error {
	type line struct {
		key  listedKey
		text string
	}
	var lines []line
	err := eachDiffPair(cfg, cs, pairOpts{listing: true, noContent: true}, func(d *diffPair) error {
		oldType := d.c.Type
		if d.old.exists {
			oldType = layers.TypeName(d.old.mode)
		}
		lines = append(lines, line{keyOf(d), nameStatusLine(d.c, oldType)})
		return nil
	})
	if err != nil {
		return err
	}
	slices.SortStableFunc(lines, func(a, b line) int { return compareListed(a.key, b.key) })
	bw := bufio.NewWriter(w)
	for _, l := range lines {
		if _, err := bw.WriteString(l.text + "\n"); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// nameStatusLine is the name-status line of c (without its newline);
// oldType is the original's type of a modified path.
func nameStatusLine(c layers.Change, oldType string) string {
	if c.Kind == layers.Renamed {
		return "R\t" + gitQuote(c.From) + "\t" + gitQuote(c.Path)
	}
	return statusLetter(c, oldType) + "\t" + gitQuote(c.Path)
}

// statusLetter is the name-status letter of c; oldType is the original's
// type of a modified path.
func statusLetter(c layers.Change, oldType string) string {
	switch c.Kind {
	case layers.Created, layers.Linked:
		return "A"
	case layers.Deleted:
		return "D"
	case layers.Renamed:
		return "R"
	case layers.Metadata:
		return "m"
	case layers.Modified:
		if oldType != c.Type {
			return "T"
		}
		return "M"
	}
	return "?"
}
