package commit

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
)

// The line diff behind Diff: Myers' O(ND) algorithm in its linear-space
// form (bisect on the middle snake), on lines interned to integers, with
// the common head and tail stripped first. A subproblem whose edit
// distance exceeds a budget is given up on and reported as "all of a
// removed, all of b added": the patch stays correct, only less minimal,
// and a huge rewritten file cannot take quadratic time.

// diffLine is one line of a unified diff: ' ', '-' or '+' and the index
// of the line in its file (a for ' ' and '-', b for '+').
type diffLine struct {
	op   byte
	a, b int // positions in a and b when the line is emitted
}

// splitLines cuts data into lines, each keeping its '\n'; the last line
// lacks it when data does not end with one.
func splitLines(data []byte) []string {
	var lines []string
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			lines = append(lines, string(data))
			break
		}
		lines = append(lines, string(data[:i+1]))
		data = data[i+1:]
	}
	return lines
}

// lineDiffer holds the state of one comparison.
type lineDiffer struct {
	a, b       []int
	delA, insB []bool
	budget     int // largest edit distance one bisect may search
}

// diffLines returns the edit script turning a into b, deletions of a
// change block before its insertions, as git prints them.
func diffLines(a, b []string) []diffLine {
	ids := map[string]int{}
	intern := func(lines []string) []int {
		out := make([]int, len(lines))
		for i, l := range lines {
			id, ok := ids[l]
			if !ok {
				id = len(ids)
				ids[l] = id
			}
			out[i] = id
		}
		return out
	}
	d := &lineDiffer{a: intern(a), b: intern(b), delA: make([]bool, len(a)), insB: make([]bool, len(b))}
	// About 5e7 diagonal steps per bisect at most, and never fewer than 256.
	d.budget = max(256, 50_000_000/(len(a)+len(b)+1))
	d.compare(0, len(a), 0, len(b))
	var out []diffLine
	for i, j := 0, 0; i < len(a) || j < len(b); {
		switch {
		case i < len(a) && d.delA[i]:
			out = append(out, diffLine{'-', i, j})
			i++
		case j < len(b) && d.insB[j]:
			out = append(out, diffLine{'+', i, j})
			j++
		default:
			out = append(out, diffLine{' ', i, j})
			i, j = i+1, j+1
		}
	}
	return out
}

// compare marks the differences of a[aLo:aHi] and b[bLo:bHi].
func (d *lineDiffer) compare(aLo, aHi, bLo, bHi int) {
	for aLo < aHi && bLo < bHi && d.a[aLo] == d.b[bLo] {
		aLo, bLo = aLo+1, bLo+1
	}
	for aLo < aHi && bLo < bHi && d.a[aHi-1] == d.b[bHi-1] {
		aHi, bHi = aHi-1, bHi-1
	}
	if aLo == aHi || bLo == bHi {
		d.markAll(aLo, aHi, bLo, bHi)
		return
	}
	x, y, ok := d.bisect(aLo, aHi, bLo, bHi)
	if !ok {
		d.markAll(aLo, aHi, bLo, bHi)
		return
	}
	d.compare(aLo, x, bLo, y)
	d.compare(x, aHi, y, bHi)
}

func (d *lineDiffer) markAll(aLo, aHi, bLo, bHi int) {
	for i := aLo; i < aHi; i++ {
		d.delA[i] = true
	}
	for j := bLo; j < bHi; j++ {
		d.insB[j] = true
	}
}

// bisect finds a point on an optimal path through the box by running
// the search forwards from the top left and backwards from the bottom
// right until they overlap (the middle snake); it follows the bisection
// of diff-match-patch, which trims the diagonals that leave the box.
// Diagonals are k = x - y, each direction in its own coordinates.
func (d *lineDiffer) bisect(aLo, aHi, bLo, bHi int) (int, int, bool) {
	n, m := aHi-aLo, bHi-bLo
	maxD := (n + m + 1) / 2
	off := maxD
	vf, vb := make([]int, 2*maxD+2), make([]int, 2*maxD+2)
	for i := range vf {
		vf[i], vb[i] = -1, -1
	}
	vf[off+1], vb[off+1] = 0, 0
	delta := n - m
	front := delta%2 != 0
	var fStart, fEnd, bStart, bEnd int
	for D := 0; D < maxD && D <= d.budget; D++ {
		for k := -D + fStart; k <= D-fEnd; k += 2 {
			x := nextX(vf, off, k, D)
			y := x - k
			for x < n && y < m && d.a[aLo+x] == d.b[bLo+y] {
				x, y = x+1, y+1
			}
			vf[off+k] = x
			switch kb := off + delta - k; {
			case x > n:
				fEnd += 2
			case y > m:
				fStart += 2
			case front && kb >= 0 && kb < len(vb) && vb[kb] != -1 && x >= n-vb[kb]:
				return aLo + x, bLo + y, true
			}
		}
		for k := -D + bStart; k <= D-bEnd; k += 2 {
			u := nextX(vb, off, k, D)
			v := u - k
			for u < n && v < m && d.a[aHi-1-u] == d.b[bHi-1-v] {
				u, v = u+1, v+1
			}
			vb[off+k] = u
			switch kf := off + delta - k; {
			case u > n:
				bEnd += 2
			case v > m:
				bStart += 2
			case !front && kf >= 0 && kf < len(vf) && vf[kf] != -1 && vf[kf] >= n-u:
				x := vf[kf]
				return aLo + x, bLo + x - (kf - off), true
			}
		}
	}
	return 0, 0, false
}

// nextX is the x diagonal k starts from at distance D: one down from
// diagonal k+1 or one right from k-1, whichever reached further.
func nextX(v []int, off, k, D int) int {
	if k == -D || (k != D && v[off+k-1] < v[off+k+1]) {
		return v[off+k+1]
	}
	return v[off+k-1] + 1
}

// hunkRange formats one side of a hunk header as git does: "start,count",
// "start" for one line, and for no lines the line before the hunk.
func hunkRange(start, count int) string {
	switch count {
	case 0:
		return strconv.Itoa(start) + ",0"
	case 1:
		return strconv.Itoa(start + 1)
	}
	return strconv.Itoa(start+1) + "," + strconv.Itoa(count)
}

// writeHunks writes the unified hunks of the script with context lines
// of context around each change; nearby changes share a hunk.
func writeHunks(w io.Writer, a, b []string, script []diffLine, context int) error {
	for i := 0; i < len(script); {
		first := i
		for first < len(script) && script[first].op == ' ' {
			first++
		}
		if first == len(script) {
			return nil
		}
		last := first // last changed line of the hunk
		for j := first + 1; j < len(script); j++ {
			if script[j].op != ' ' {
				if j-last-1 > 2*context {
					break
				}
				last = j
			}
		}
		start, end := max(first-context, i), min(last+context+1, len(script))
		if err := writeHunk(w, a, b, script[start:end]); err != nil {
			return err
		}
		i = end
	}
	return nil
}

func writeHunk(w io.Writer, a, b []string, h []diffLine) error {
	na, nb := 0, 0
	for _, l := range h {
		if l.op != '+' {
			na++
		}
		if l.op != '-' {
			nb++
		}
	}
	if _, err := fmt.Fprintf(w, "@@ -%s +%s @@\n", hunkRange(h[0].a, na), hunkRange(h[0].b, nb)); err != nil {
		return err
	}
	for _, l := range h {
		var text string
		if l.op == '+' {
			text = b[l.b]
		} else {
			text = a[l.a]
		}
		if err := writeDiffLine(w, l.op, text); err != nil {
			return err
		}
	}
	return nil
}

func writeDiffLine(w io.Writer, op byte, text string) error {
	buf := make([]byte, 0, len(text)+32)
	buf = append(buf, op)
	buf = append(buf, text...)
	if len(text) == 0 || text[len(text)-1] != '\n' {
		buf = append(buf, "\n\\ No newline at end of file\n"...)
	}
	_, err := w.Write(buf)
	return err
}

// countLines returns the lines the script adds and deletes.
func countLines(script []diffLine) (added, deleted int) {
	for _, l := range script {
		switch l.op {
		case '+':
			added++
		case '-':
			deleted++
		}
	}
	return added, deleted
}
