package main

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// results holds every sample, keyed by group, row and column (a target
// name, or n=N for the scaling tables), in base units: seconds, bytes,
// bytes per second, operations per second.
type results struct {
	mu      sync.Mutex
	started time.Time
	elapsed time.Duration
	machine [][2]string
	samples map[string][]float64
	errors  []string
}

func newResults() *results { return &results{samples: map[string][]float64{}} }

func key(group, row, col string) string { return group + "/" + row + "/" + col }

func (r *results) add(group, row, col string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := key(group, row, col)
	r.samples[k] = append(r.samples[k], v)
}

func (r *results) addError(group, col string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	where := group
	if col != "" {
		where += " on " + col
	}
	r.errors = append(r.errors, fmt.Sprintf("%s: %v", where, err))
}

// median of a cell's samples.
func (r *results) median(group, row, col string) (float64, bool) {
	r.mu.Lock()
	s := append([]float64(nil), r.samples[key(group, row, col)]...)
	r.mu.Unlock()
	if len(s) == 0 {
		return 0, false
	}
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

// getter reads the medians of one group.
type getter func(row, col string) (float64, bool)

// A row of a table: what is measured, its unit and direction, and the
// issue's target for sbxfs when there is one.
type rowSpec struct {
	group, key, label string
	short             string  // chart label
	unit              string  // display unit
	scale             float64 // display value = value / scale
	higher            bool    // higher is better (throughput)
	goal              *goal
}

// A goal says whether sbxfs met a target of the issue, from the medians.
type goal struct {
	text string
	eval func(get getter, row rowSpec) (ok, known bool, why string)
}

// verdict is the text of the target column.
func (g *goal) verdict(get getter, row rowSpec) string {
	if g == nil {
		return ""
	}
	return verdictText(g.eval(get, row))
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// slowdown of a against b: how many times worse a is (time: a/b;
// throughput: b/a).
func slowdown(a, b float64, higher bool) float64 {
	if higher {
		return b / a
	}
	return a / b
}

// fuseTolerance is how much slower than fuse-overlayfs still counts as
// "not slower": the noise between two medians of a shared machine.
const fuseTolerance = 1.05

// vsOverlay: sbxfs within f times kernel overlayfs (for throughput: at
// least f times), and, when fuse is set, no worse than fuse-overlayfs
// (strictly better when strict).
func vsOverlay(f float64, fuse, strict bool) *goal {
	var parts []string
	if f > 0 {
		parts = append(parts, fmt.Sprintf("≤ %g× overlayfs", f))
	}
	if fuse && strict {
		parts = append(parts, "< fuse-overlayfs")
	} else if fuse {
		parts = append(parts, "≤ fuse-overlayfs (+5 % noise)")
	}
	return &goal{text: strings.Join(parts, ", "), eval: func(get getter, row rowSpec) (bool, bool, string) {
		s, ok := get(row.key, "sbxfs")
		if !ok {
			return false, false, "no sbxfs result"
		}
		met, why := true, []string{}
		if f > 0 {
			o, ok := get(row.key, refTarget)
			if !ok {
				return false, false, "no overlayfs result"
			}
			r := s / o
			if row.higher {
				if r < f {
					met = false
				}
				why = append(why, fmt.Sprintf("%.2f×", r))
			} else {
				if r > f {
					met = false
				}
				why = append(why, fmt.Sprintf("%.2f×", r))
			}
		}
		if fuse {
			u, ok := get(row.key, "fuse-overlayfs")
			if !ok {
				return false, false, "no fuse-overlayfs result"
			}
			sd := slowdown(s, u, row.higher)
			if (strict && sd >= 1) || (!strict && sd > fuseTolerance) {
				met = false
				why = append(why, fmt.Sprintf("%.2f× fuse-overlayfs", sd))
			}
		}
		return met, true, strings.Join(why, ", ")
	}}
}

// throughput goals read "≥ 0.9× overlayfs".
func atLeastOverlay(f float64) *goal {
	g := vsOverlay(f, false, false)
	g.text = fmt.Sprintf("≥ %g× overlayfs", f)
	return g
}

// flat: the value at the largest tree within ratio of the smallest (plus
// slack seconds, for the jitter of starting a process), and below limit
// seconds when limit > 0.
func flat(ratio, slack, limit float64, cols []string) *goal {
	text := fmt.Sprintf("flat in n: largest ≤ %g× smallest", ratio)
	if slack > 0 {
		text += fmt.Sprintf(" + %g ms", slack*1000)
	}
	if limit > 0 {
		text += fmt.Sprintf(", < %g ms", limit*1000)
	}
	return &goal{text: text, eval: func(get getter, row rowSpec) (bool, bool, string) {
		lo, ok1 := get(row.key, cols[0])
		hi, ok2 := get(row.key, cols[len(cols)-1])
		if !ok1 || !ok2 {
			return false, false, "missing sizes"
		}
		met := hi <= ratio*lo+slack
		why := fmt.Sprintf("%.2f×", hi/lo)
		if limit > 0 {
			for _, c := range cols {
				if v, ok := get(row.key, c); ok && v >= limit {
					met = false
					why += fmt.Sprintf(", %s %.0f ms", c, v*1000)
				}
			}
		}
		return met, true, why
	}}
}

// below: the cell (column col) under limit (base units).
func below(limit float64, col, text string) *goal {
	return &goal{text: text, eval: func(get getter, row rowSpec) (bool, bool, string) {
		v, ok := get(row.key, col)
		if !ok {
			return false, false, ""
		}
		return v < limit, true, ""
	}}
}

// noGrowth: the cell at row is within ratio (plus slack bytes) of the
// cell at ref, both for col.
func noGrowth(ref string, ratio, slack float64, col, text string) *goal {
	return &goal{text: text, eval: func(get getter, row rowSpec) (bool, bool, string) {
		v, ok1 := get(row.key, col)
		r, ok2 := get(ref, col)
		if !ok1 || !ok2 {
			return false, false, ""
		}
		return v <= ratio*r+slack, true, fmt.Sprintf("%.2f× after the first walk", v/r)
	}}
}

// nCol names the column of tree size n.
func nCol(n int) string { return fmt.Sprintf("n=%d", n) }

func nCols(ns []int) []string {
	var cs []string
	for _, n := range ns {
		cs = append(cs, nCol(n))
	}
	return cs
}

func kShort(n int) string {
	switch {
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

func commas(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
