package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Charts are drawn by gnuplot (Debian's gnuplot-nox, installed by
// scripts/install-deps.sh): the tool writes the data and a script, and
// gnuplot writes the PNG into the output directory.

const chartHead = `set terminal pngcairo size %d,%d font "DejaVu Sans,11" noenhanced
set output %q
set datafile missing "?"
set grid ytics lc rgb "#dddddd"
set border 3
set tics nomirror
`

var colors = map[string]string{"ext4": "#999999", "overlayfs": "#000000", "fuse-overlayfs": "#e69f00", "fuse-loopback": "#009e73", "sbxfs": "#0072b2",
	"sbxfs-uring": "#56b4e9"}

// plotSeries is a gnuplot plot command for the histogram columns of dat
// (column 2 on, with the labels in column 1), one per name, each in its
// colour, followed by extra (", ..." or "").
func plotSeries(dat string, names, titles []string, extra string) string {
	var s strings.Builder
	s.WriteString("plot ")
	for i, n := range names {
		if i == 0 {
			fmt.Fprintf(&s, "%q using 2:xtic(1)", dat)
		} else {
			fmt.Fprintf(&s, ", '' using %d", i+2)
		}
		fmt.Fprintf(&s, " title %q lc rgb %q", titles[i], colors[n])
	}
	s.WriteString(extra + "\n")
	return s.String()
}

// charts draws every chart whose data this run made and returns their
// file names (relative to the output directory).
func (e *env) charts() ([]string, error) {
	if _, err := exec.LookPath("gnuplot"); err != nil {
		return nil, errors.New("gnuplot is not installed (scripts/install-deps.sh installs gnuplot-nox)")
	}
	dir, err := os.MkdirTemp(e.work, "charts")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var made []string
	var errs []error
	draw := func(name string, fn func(dir, png string) (string, error)) {
		png := filepath.Join(e.opt.out, name)
		script, err := fn(dir, png)
		if err == nil {
			gp := filepath.Join(dir, name+".gp")
			if err = os.WriteFile(gp, []byte(script), 0o644); err == nil {
				var out []byte
				if out, err = exec.Command("gnuplot", gp).CombinedOutput(); err != nil {
					err = fmt.Errorf("%w: %s", err, out)
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			return
		}
		made = append(made, name)
	}
	if e.anyRan(compareRows(e.sz)) {
		draw("compare.png", e.compareChart)
	}
	if e.ran("create") || e.ran("diffcommit") {
		draw("lifecycle.png", e.lifecycleChart)
	}
	if e.ran("memory") {
		draw("memory.png", e.memoryChart)
	}
	return made, errors.Join(errs...)
}

func cell(v float64, ok bool) string {
	if !ok {
		return "?"
	}
	return fmt.Sprintf("%g", v)
}

// compareChart: every target's slowdown against kernel overlayfs (time
// ratio; throughput inverted), one cluster per measurement.
func (e *env) compareChart(dir, png string) (string, error) {
	var data strings.Builder
	var names []string
	for _, t := range e.targets {
		if t.name != refTarget {
			names = append(names, t.name)
		}
	}
	lo, hi := 0.5, 2.0
	for _, row := range compareRows(e.sz) {
		if !e.ran(row.group) {
			continue
		}
		ref, ok := e.res.median(row.group, row.key, refTarget)
		fmt.Fprintf(&data, "%q", row.short)
		for _, name := range names {
			v, vok := e.res.median(row.group, row.key, name)
			sd := slowdown(v, ref, row.higher)
			if ok && vok && sd > 0 {
				lo, hi = min(lo, sd), max(hi, sd)
			}
			fmt.Fprintf(&data, " %s", cell(sd, ok && vok))
		}
		data.WriteString("\n")
	}
	dat := filepath.Join(dir, "compare.dat")
	if err := os.WriteFile(dat, []byte(data.String()), 0o644); err != nil {
		return "", err
	}
	var s strings.Builder
	fmt.Fprintf(&s, chartHead, 1400, 650, png)
	s.WriteString(`set title "Slowdown against kernel overlayfs (median; time ratio, throughput inverted): 1 = as fast, lower is better"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set logscale y 2
set ylabel "× kernel overlayfs"
set xtics rotate by -30 scale 0
set key outside top center horizontal
set format y "%g"
set xrange [-0.6:*]
`)
	fmt.Fprintf(&s, "set yrange [%g:%g]\n", math.Max(1.0/256, math.Pow(2, math.Floor(math.Log2(lo)))), math.Pow(2, math.Ceil(math.Log2(hi*1.1))))
	s.WriteString("set ytics (\"1/256\" 1.0/256, \"1/64\" 1.0/64, \"1/16\" 1.0/16, \"1/4\" 0.25, \"1/2\" 0.5, \"1\" 1, \"2\" 2, \"4\" 4, \"8\" 8, \"16\" 16, \"32\" 32, \"64\" 64, \"128\" 128)\n")
	s.WriteString(plotSeries(dat, names, names, ", 1 with lines lc rgb \"black\" dt 2 lw 2 title \"overlayfs\""))
	return s.String(), nil
}

// lifecycleChart: create, diff and commit time against the tree size.
func (e *env) lifecycleChart(dir, png string) (string, error) {
	type series struct{ title, group, key, style string }
	panels := []struct {
		title  string
		series []series
	}{
		{"create", []series{
			{"sbxfs mount", "create", "mount", "lw 2 pt 7"},
			{"sbxfs create (daemon)", "create", "create", "lw 2 pt 5"},
		}},
	}
	for _, op := range []string{"diff", "commit"} {
		var ss []series
		for _, fsys := range []string{"same", "other"} {
			for i, k := range e.sz.lifeK {
				dt := "dt 1"
				where := "same fs"
				if fsys == "other" {
					dt, where = "dt 2", "tmpfs"
				}
				ss = append(ss, series{fmt.Sprintf("k=%s, %s", kShort(k), where), "diffcommit",
					fmt.Sprintf("%s.%s.k%d", op, fsys, k), fmt.Sprintf("lw 2 pt %d lc %d %s", 5+2*i, i+1, dt)})
			}
		}
		panels = append(panels, struct {
			title  string
			series []series
		}{op, ss})
	}
	// Only the panels this run has numbers for.
	kept := panels[:0]
	for _, p := range panels {
		has := false
		for _, se := range p.series {
			for _, n := range e.sz.lifeN {
				if _, ok := e.res.median(se.group, se.key, nCol(n)); ok {
					has = true
				}
			}
		}
		if has {
			kept = append(kept, p)
		}
	}
	panels = kept
	if len(panels) == 0 {
		return "", errors.New("no create, diff or commit results")
	}
	var s strings.Builder
	fmt.Fprintf(&s, chartHead, 500*len(panels), 600, png)
	fmt.Fprintf(&s, "set multiplot layout 1,%d title \"sbxfs: time (ms) against the number of files in the original (x axis); flat is the goal\"\n", len(panels))
	s.WriteString("set logscale x 10\nset logscale y 10\nset key below horizontal maxrows 2 font \",9\"\n")
	fmt.Fprintf(&s, "set xrange [%g:%g]\n", float64(e.sz.lifeN[0])/2, float64(e.sz.lifeN[len(e.sz.lifeN)-1])*2)
	for pi, p := range panels {
		var data strings.Builder
		for _, n := range e.sz.lifeN {
			fmt.Fprintf(&data, "%d", n)
			for _, se := range p.series {
				v, ok := e.res.median(se.group, se.key, nCol(n))
				fmt.Fprintf(&data, " %s", cell(v*1000, ok))
			}
			data.WriteString("\n")
		}
		dat := filepath.Join(dir, fmt.Sprintf("life%d.dat", pi))
		if err := os.WriteFile(dat, []byte(data.String()), 0o644); err != nil {
			return "", err
		}
		fmt.Fprintf(&s, "set title %q\nplot ", p.title)
		for i, se := range p.series {
			if i > 0 {
				s.WriteString(", ")
			}
			fmt.Fprintf(&s, "%q using 1:%d with linespoints %s title %q", dat, i+2, se.style, se.title)
		}
		s.WriteString("\n")
	}
	s.WriteString("unset multiplot\n")
	return s.String(), nil
}

// memoryChart: server RSS through the walk, and the daemon's with idle
// sandboxes, for each sbxfs transport measured.
func (e *env) memoryChart(dir, png string) (string, error) {
	sbx := e.sbxfsCols()
	servers := append(append([]string(nil), sbx...), "fuse-overlayfs")
	var data strings.Builder
	for _, row := range memoryRows(e.sz) {
		if row.unit != "MiB" {
			continue
		}
		fmt.Fprintf(&data, "%q", strings.SplitN(stripTicks(row.label), " (", 2)[0])
		for _, t := range servers {
			v, ok := e.res.median("memory", row.key, t)
			fmt.Fprintf(&data, " %s", cell(v/mib, ok))
		}
		data.WriteString("\n")
	}
	dat := filepath.Join(dir, "memory.dat")
	if err := os.WriteFile(dat, []byte(data.String()), 0o644); err != nil {
		return "", err
	}
	var d2 strings.Builder
	for _, key := range []string{"daemon.idle", "daemon.loaded"} {
		label := "no sandboxes"
		if key == "daemon.loaded" {
			label = fmt.Sprintf("%d idle sandboxes", e.sz.idleSandboxes)
		}
		fmt.Fprintf(&d2, "%q", label)
		for _, t := range sbx {
			v, ok := e.res.median("memory", key, t)
			fmt.Fprintf(&d2, " %s", cell(v/mib, ok))
		}
		d2.WriteString("\n")
	}
	dat2 := filepath.Join(dir, "daemon.dat")
	if err := os.WriteFile(dat2, []byte(d2.String()), 0o644); err != nil {
		return "", err
	}
	titles := func(names []string, suffix string) []string {
		var ts []string
		for _, n := range names {
			if n == "fuse-overlayfs" {
				ts = append(ts, n)
			} else {
				ts = append(ts, fmt.Sprintf("%s%s (%s)", n, suffix, transportOf(n)))
			}
		}
		return ts
	}
	var s strings.Builder
	fmt.Fprintf(&s, chartHead, 1300, 550, png)
	s.WriteString(`set multiplot layout 1,2 title "Resident memory (VmRSS, MiB) of the serving process"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set yrange [0:*]
set xtics rotate by -20 scale 0 font ",9"
set key below horizontal
`)
	fmt.Fprintf(&s, "set title \"one mount, %s-file original\"\n", commas(e.sz.lifeN[len(e.sz.lifeN)-1]))
	s.WriteString(plotSeries(dat, servers, titles(servers, ""), ""))
	s.WriteString("set title \"sbxfs daemon\"\nset xtics rotate by 0\n")
	s.WriteString(plotSeries(dat2, sbx, titles(sbx, " daemon"), ""))
	s.WriteString("unset multiplot\n")
	return s.String(), nil
}
