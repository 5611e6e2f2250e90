package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// report writes results.md, results.json and the charts into the output
// directory.
func (e *env) report() error {
	if err := os.MkdirAll(e.opt.out, 0o755); err != nil {
		return err
	}
	charts, chartErr := e.charts()
	if chartErr != nil {
		e.logf("charts: %v", chartErr)
	}
	md := e.markdown(charts, chartErr)
	if err := os.WriteFile(filepath.Join(e.opt.out, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	j, err := json.MarshalIndent(savedResults{
		Date:     e.res.started.UTC().Format(time.RFC3339),
		Elapsed:  e.res.elapsed.Seconds(),
		Command:  e.opt.command,
		Reps:     e.opt.reps,
		Quick:    e.opt.quick,
		Machine:  e.res.machine,
		Samples:  e.res.samples,
		Errors:   e.res.errors,
		Targets:  e.targetNames(),
		URingOut: e.uring.skip,
		Charting: "scripts/bench --rerender --out DIR redraws results.md and the charts from this file",
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(e.opt.out, "results.json"), append(j, '\n'), 0o644)
}

// savedResults is results.json.
type savedResults struct {
	Date    string               `json:"date"`
	Elapsed float64              `json:"elapsed_s"`
	Command string               `json:"command"`
	Reps    int                  `json:"reps"`
	Quick   bool                 `json:"quick"`
	Machine [][2]string          `json:"machine"`
	Samples map[string][]float64 `json:"samples"`
	Errors  []string             `json:"errors"`
	// Targets measured (absent in results.json from before sbxfs-uring:
	// the four others), and why sbxfs-uring was left out.
	Targets  []string `json:"targets,omitempty"`
	URingOut string   `json:"uring_left_out,omitempty"`
	Charting string   `json:"note"`
}

// rerender loads results.json from the output directory and writes
// results.md and the charts again (after a change of the report's code),
// without measuring anything.
func rerender(opt options) error {
	b, err := os.ReadFile(filepath.Join(opt.out, "results.json"))
	if err != nil {
		return err
	}
	var sr savedResults
	if err := json.Unmarshal(b, &sr); err != nil {
		return fmt.Errorf("results.json: %w", err)
	}
	opt.quick, opt.reps, opt.command = sr.Quick, sr.Reps, sr.Command
	opt.only = map[string]bool{}
	for k := range sr.Samples {
		g, _, _ := strings.Cut(k, "/")
		opt.only[g] = true
	}
	e := newEnv(context.Background(), opt)
	e.res.samples, e.res.errors, e.res.machine = sr.Samples, sr.Errors, sr.Machine
	if e.res.started, err = time.Parse(time.RFC3339, sr.Date); err != nil {
		return fmt.Errorf("results.json date: %w", err)
	}
	e.res.elapsed = time.Duration(sr.Elapsed * float64(time.Second))
	if sr.Targets == nil {
		e.targets = withoutTarget(allTargets, uringTarget)
		e.uring.skip = "this results.json was made before the benchmark measured it"
	} else {
		e.targets = nil
		for _, t := range allTargets {
			if slices.Contains(sr.Targets, t.name) {
				e.targets = append(e.targets, t)
			}
		}
		e.uring.skip = sr.URingOut
	}
	return e.report()
}

// targetNames are the names of the run's targets.
func (e *env) targetNames() []string {
	var ns []string
	for _, t := range e.targets {
		ns = append(ns, t.name)
	}
	return ns
}

// hasTarget: the run measured the target called name.
func (e *env) hasTarget(name string) bool { return slices.Contains(e.targetNames(), name) }

// sbxfsCols are the sbxfs targets whose goals the report checks: sbxfs
// (requests through /dev/fuse) and sbxfs-uring (through io_uring) when
// measured.
func (e *env) sbxfsCols() []string {
	var cs []string
	for _, t := range e.targets {
		if t.kind == kindSbxfs {
			cs = append(cs, t.name)
		}
	}
	return cs
}

// transportOf names the transport of an sbxfs target.
func transportOf(col string) string {
	if col == uringTarget {
		return "io_uring"
	}
	return "/dev/fuse"
}

// evalFor checks row's goal for the sbxfs target col. The goals read the
// column "sbxfs"; for sbxfs-uring they are given that target's column
// under the name.
func (e *env) evalFor(row rowSpec, col string) (ok, known bool, why string) {
	get := func(r, c string) (float64, bool) { return e.res.median(row.group, r, c) }
	if col != sbxfsTarget {
		if _, has := get(row.key, col); !has {
			return false, false, "no " + col + " result"
		}
		own := get
		get = func(r, c string) (float64, bool) {
			if c == sbxfsTarget {
				c = col
			}
			return own(r, c)
		}
	}
	return row.goal.eval(get, row)
}

// verdictText is the text of a verdict cell.
func verdictText(ok, known bool, why string) string {
	switch {
	case !known:
		return "n/a" + paren(why)
	case ok:
		return "met" + paren(why)
	}
	return "**missed**" + paren(why)
}

// ran says whether a group was part of this run.
func (e *env) ran(g string) bool { return e.opt.only[g] }

func (e *env) markdown(charts []string, chartErr error) string {
	var b strings.Builder
	r := e.res
	fmt.Fprintf(&b, "# sbxfs benchmark results\n\n")
	fmt.Fprintf(&b, "Made by `%s` on %s (%s, %d repetition(s), medians). ", e.opt.command,
		r.started.UTC().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second), e.opt.reps)
	fmt.Fprintf(&b, "What each measurement does and how to read it: [README.md](README.md).\n\n")
	if e.opt.quick {
		fmt.Fprintf(&b, "**Quick run** (`--quick`): small sizes, one repetition; a smoke test, not numbers to quote.\n\n")
	}
	sections := e.sections()
	e.targetsSection(&b, sections)
	for _, s := range sections {
		if !e.anyRan(s.rows) {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", s.title, s.intro)
		vcols := []string{sbxfsTarget}
		if s.transports {
			vcols = e.sbxfsCols()
		}
		switch s.kind {
		case tableCompare:
			e.compareTable(&b, s.rows, vcols)
		case tableScaling:
			e.scalingTable(&b, s.rows)
		case tableColumns:
			var cols []string
			for _, c := range s.cols {
				if e.hasTarget(c) {
					cols = append(cols, c)
				}
			}
			e.columnsTable(&b, s.rows, cols, vcols)
		}
		for _, c := range charts {
			if strings.HasPrefix(c, s.chart+".") && s.chart != "" {
				fmt.Fprintf(&b, "\n![%s](%s)\n", s.title, c)
			}
		}
		b.WriteString("\n")
	}
	if chartErr != nil {
		fmt.Fprintf(&b, "Charts were not made: %v.\n\n", chartErr)
	}
	if len(r.errors) > 0 {
		fmt.Fprintf(&b, "## Errors\n\n")
		for _, er := range r.errors {
			fmt.Fprintf(&b, "* %s\n", strings.ReplaceAll(er, "\n", " "))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "## Machine\n\n| | |\n| --- | --- |\n")
	for _, kv := range r.machine {
		fmt.Fprintf(&b, "| %s | %s |\n", kv[0], strings.ReplaceAll(kv[1], "|", "\\|"))
	}
	fmt.Fprintf(&b, "\nAll samples: [results.json](results.json).\n")
	return b.String()
}

// targetsSection writes the Targets section: the count of the issue's
// targets met per sbxfs transport, a table of every target checked per
// transport with each transport's verdict, and the missed targets of the
// groups measured with sbxfs over /dev/fuse only.
func (e *env) targetsSection(b *strings.Builder, sections []section) {
	type tally struct{ met, missed, unknown int }
	cols := e.sbxfsCols()
	counts := map[string]*tally{}
	for _, c := range cols {
		counts[c] = &tally{}
	}
	count := func(c string, ok, known bool) {
		switch {
		case !known:
			counts[c].unknown++
		case ok:
			counts[c].met++
		default:
			counts[c].missed++
		}
	}
	type perRow struct {
		name string
		row  rowSpec
	}
	var per []perRow
	var onlyMissed []string
	onlyGoals, perRan := 0, false
	for _, s := range sections {
		if s.transports && e.anyRan(s.rows) {
			perRan = true
		}
		for _, row := range s.rows {
			if row.goal == nil || !e.ran(row.group) {
				continue
			}
			if s.transports {
				name := row.label
				if s.kind != tableCompare {
					name = strings.TrimPrefix(s.title, "sbxfs: ") + ": " + name
				}
				per = append(per, perRow{name, row})
				for _, c := range cols {
					ok, known, _ := e.evalFor(row, c)
					count(c, ok, known)
				}
				continue
			}
			onlyGoals++
			ok, known, why := e.evalFor(row, sbxfsTarget)
			count(sbxfsTarget, ok, known)
			if known && !ok {
				onlyMissed = append(onlyMissed, stripTicks(row.label)+paren(why))
			}
		}
	}
	b.WriteString("## Targets\n\n")
	var parts []string
	shown := 0
	for _, c := range cols {
		t := counts[c]
		if c != sbxfsTarget && t.met+t.missed+t.unknown == 0 {
			continue // no goal of this run depends on the transport
		}
		shown++
		p := fmt.Sprintf("**%s** (requests through %s): %d met, %d missed", c, transportOf(c), t.met, t.missed)
		if t.unknown > 0 {
			p += fmt.Sprintf(", %d not measured", t.unknown)
		}
		parts = append(parts, p+fmt.Sprintf(" of %d", t.met+t.missed+t.unknown))
	}
	b.WriteString(strings.Join(parts, "; "))
	b.WriteString(" (the targets of issue 5, checked on the medians below")
	if shown > 1 && onlyGoals > 0 {
		fmt.Fprintf(b, "; the %d targets of create, diff and commit do not depend on the transport and are measured once, "+
			"with sbxfs over /dev/fuse: they count for sbxfs only", onlyGoals)
	}
	b.WriteString(").\n\n")
	if !e.hasTarget(uringTarget) && perRan {
		fmt.Fprintf(b, "**%s** (sbxfs with its requests through io_uring) **was not measured**: %s.\n\n", uringTarget, e.uring.skip)
	}
	if len(per) > 0 {
		b.WriteString("| measurement | target |")
		for _, c := range cols {
			fmt.Fprintf(b, " %s (%s) |", c, transportOf(c))
		}
		b.WriteString("\n| --- | --- |")
		for range cols {
			b.WriteString(" --- |")
		}
		b.WriteString("\n")
		for _, p := range per {
			fmt.Fprintf(b, "| %s | %s |", p.name, p.row.goal.text)
			for _, c := range cols {
				fmt.Fprintf(b, " %s |", verdictText(e.evalFor(p.row, c)))
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	for _, m := range onlyMissed {
		fmt.Fprintf(b, "* missed (sbxfs): %s\n", m)
	}
	if len(onlyMissed) > 0 {
		b.WriteString("\n")
	}
}

func (e *env) anyRan(rows []rowSpec) bool {
	for _, r := range rows {
		if e.ran(r.group) {
			return true
		}
	}
	return false
}

type tableKind int

const (
	tableCompare tableKind = iota // one column per target, ratio to overlayfs
	tableScaling                  // one column per tree size
	tableColumns                  // given columns
)

type section struct {
	title, intro string
	kind         tableKind
	rows         []rowSpec
	cols         []string // tableColumns: its columns (the targets measured of them)
	chart        string   // chart file prefix
	// transports: the section's goals are checked for every sbxfs
	// target (sbxfs and sbxfs-uring), not only for sbxfs.
	transports bool
}

func (e *env) sections() []section {
	sz := e.sz
	compareIntro := "Median of each target, and in parentheses its ratio to kernel overlayfs (for times, > 1× is slower; " +
		"for MiB/s and IOPS, < 1× is slower). ↓: lower is better, ↑: higher is better. " +
		"fuse-loopback is go-fuse's loopback example serving the ext4 target's tree (no layers, no journal): " +
		"what FUSE costs with a server that only forwards, for reference; no target applies to it. " +
		"The target column is the issue's target for sbxfs"
	memoryIntro := "VmRSS of the process serving the mount (`sbxfs mount`'s server"
	daemonIntro := "VmRSS of `sbxfs daemon` (private state root) before and after `sbxfs create` of idle sandboxes of a small original"
	lifeNote := ""
	if e.hasTarget(uringTarget) {
		compareIntro += "; the verdict columns say whether each sbxfs transport meets it. " +
			"sbxfs is mounted with `--no-io-uring` (requests through /dev/fuse, as on every stock kernel), " +
			"sbxfs-uring without it while the fuse module's `enable_uring` is Y (requests through io_uring)."
		memoryIntro += ", with `--no-io-uring` for sbxfs and through io_uring for sbxfs-uring; fuse-overlayfs for comparison)."
		daemonIntro += ": for sbxfs started with `sbxfs daemon --no-io-uring` (its sandboxes take their requests from /dev/fuse), " +
			"for sbxfs-uring without it (through io_uring); the fuse module's `enable_uring` is Y for both."
		lifeNote = " sbxfs over /dev/fuse: `enable_uring` is N while create, diff, commit and plan run."
	} else {
		compareIntro += "."
		memoryIntro += "; fuse-overlayfs for comparison)."
		daemonIntro += "."
	}
	return []section{
		{title: "Filesystem workloads", kind: tableCompare, rows: compareRows(sz), chart: "compare", transports: true,
			intro: compareIntro},
		{title: "sbxfs: create", kind: tableScaling, rows: createRows(sz), chart: "lifecycle",
			intro: "Time of the command until the sandbox is usable, for originals of n files (ms)." + lifeNote},
		{title: "sbxfs: diff and commit", kind: tableScaling, rows: diffCommitRows(sz),
			intro: "Time of `sbxfs diff` (whole patch) and `sbxfs commit` of k files changed through the mount, " +
				"originals of n files (ms); the upper on the scratch ext4 (commit renames) or on a tmpfs (commit copies)." + lifeNote},
		{title: "sbxfs: plan commit", kind: tableColumns, rows: planRows(sz), cols: []string{sbxfsTarget},
			intro: "Sandboxes made with `sbxfs create --plan` (daemon, private `--state-dir`), files changed through their mounts, then `sbxfs commit --plan`." + lifeNote},
		{title: "sbxfs: memory", kind: tableColumns, rows: memoryRows(sz), cols: []string{sbxfsTarget, uringTarget, "fuse-overlayfs"}, chart: "memory", transports: true,
			intro: memoryIntro},
		{title: "sbxfs: daemon with idle sandboxes", kind: tableColumns, rows: daemonRows(sz), cols: []string{sbxfsTarget, uringTarget}, transports: true,
			intro: daemonIntro},
	}
}

// verdictHeader writes the header cells of the target column (called
// target when there is one verdict column) and the verdict columns (one
// per sbxfs target in vcols), and their alignment row after the rest of
// the alignment row (align).
func verdictHeader(b *strings.Builder, target string, vcols []string, align string) {
	if len(vcols) == 1 {
		fmt.Fprintf(b, " %s | |\n%s --- | --- |\n", target, align)
		return
	}
	b.WriteString(" target |")
	for _, c := range vcols {
		fmt.Fprintf(b, " verdict (%s) |", c)
	}
	fmt.Fprintf(b, "\n%s --- |", align)
	for range vcols {
		b.WriteString(" --- |")
	}
	b.WriteString("\n")
}

// verdictCells writes a row's target and its verdict for every vcols.
func (e *env) verdictCells(b *strings.Builder, row rowSpec, vcols []string) {
	if row.goal == nil {
		b.WriteString(" — |")
		for range vcols {
			b.WriteString(" |")
		}
		b.WriteString("\n")
		return
	}
	fmt.Fprintf(b, " %s |", row.goal.text)
	for _, c := range vcols {
		fmt.Fprintf(b, " %s |", verdictText(e.evalFor(row, c)))
	}
	b.WriteString("\n")
}

func (e *env) compareTable(b *strings.Builder, rows []rowSpec, vcols []string) {
	fmt.Fprintf(b, "| measurement | unit |")
	for _, t := range e.targets {
		fmt.Fprintf(b, " %s |", t.name)
	}
	align := "| --- | --- |" + strings.Repeat(" ---: |", len(e.targets))
	verdictHeader(b, "target (sbxfs)", vcols, align)
	for _, row := range rows {
		if !e.ran(row.group) {
			continue
		}
		get := func(r, c string) (float64, bool) { return e.res.median(row.group, r, c) }
		arrow := "↓"
		if row.higher {
			arrow = "↑"
		}
		fmt.Fprintf(b, "| %s | %s %s |", row.label, row.unit, arrow)
		ref, refOK := get(row.key, refTarget)
		for _, t := range e.targets {
			v, ok := get(row.key, t.name)
			switch {
			case !ok:
				b.WriteString(" error |")
			case t.name == refTarget || !refOK:
				fmt.Fprintf(b, " %s |", num(v/row.scale))
			default:
				fmt.Fprintf(b, " %s (%.2f×) |", num(v/row.scale), v/ref)
			}
		}
		e.verdictCells(b, row, vcols)
	}
}

func (e *env) scalingTable(b *strings.Builder, rows []rowSpec) {
	cols := nCols(e.sz.lifeN)
	fmt.Fprintf(b, "| operation |")
	for _, n := range e.sz.lifeN {
		fmt.Fprintf(b, " n = %s |", commas(n))
	}
	fmt.Fprintf(b, " target | |\n| --- |")
	for range cols {
		b.WriteString(" ---: |")
	}
	b.WriteString(" --- | --- |\n")
	for _, row := range rows {
		get := func(r, c string) (float64, bool) { return e.res.median(row.group, r, c) }
		fmt.Fprintf(b, "| %s |", row.label)
		for _, c := range cols {
			if v, ok := get(row.key, c); ok {
				fmt.Fprintf(b, " %s |", num(v/row.scale))
			} else {
				b.WriteString(" — |")
			}
		}
		fmt.Fprintf(b, " %s | %s |\n", row.goal.text, row.goal.verdict(get, row))
	}
}

func (e *env) columnsTable(b *strings.Builder, rows []rowSpec, cols, vcols []string) {
	fmt.Fprintf(b, "| measurement | unit |")
	for _, c := range cols {
		fmt.Fprintf(b, " %s |", c)
	}
	verdictHeader(b, "target", vcols, "| --- | --- |"+strings.Repeat(" ---: |", len(cols)))
	for _, row := range rows {
		get := func(r, c string) (float64, bool) { return e.res.median(row.group, r, c) }
		fmt.Fprintf(b, "| %s | %s |", row.label, row.unit)
		for _, c := range cols {
			if v, ok := get(row.key, c); ok {
				fmt.Fprintf(b, " %s |", num(v/row.scale))
			} else {
				b.WriteString(" — |")
			}
		}
		e.verdictCells(b, row, vcols)
	}
}

// num formats a value with about three significant digits.
func num(v float64) string {
	switch {
	case v >= 1000:
		return commas(int(v + 0.5))
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

func stripTicks(s string) string { return strings.ReplaceAll(s, "`", "") }

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// machineInfo describes the machine, the software measured and the
// scratch disk.
func machineInfo(e *env) [][2]string {
	first := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return "?"
		}
		l, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return l
	}
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	osName := "?"
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				osName = strings.Trim(v, `"`)
			}
		}
	}
	rev := first("git", "-C", e.opt.repo, "rev-parse", "--short", "HEAD")
	if out, _ := exec.Command("git", "-C", e.opt.repo, "status", "--porcelain", "--untracked-files=no").Output(); len(out) > 0 {
		rev += " (with uncommitted changes)"
	}
	disk := "?"
	for _, m := range readMounts() {
		if m.point == e.disk {
			disk = fmt.Sprintf("%s on %s (%s), journaled ext4 made by scripts/bench-disk.sh", m.fstype, m.source, e.disk)
		}
	}
	fo := "?"
	if out, err := exec.Command("fuse-overlayfs", "--version").CombinedOutput(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "fuse-overlayfs") {
				fo = l
			}
		}
	}
	return [][2]string{
		{"CPU", fmt.Sprintf("%s, %d cores", cpu, runtime.NumCPU())},
		{"memory", mem},
		{"OS, kernel", osName + ", Linux " + first("uname", "-r")},
		{"scratch disk", disk},
		{"sbxfs", first(e.opt.sbxfs, "--version") + ", commit " + rev},
		{"fuse-overlayfs", fo},
		{"tools", strings.Join([]string{first("fio", "--version"), first("git", "--version"), first(e.goBin, "version"), first("tar", "--version")}, "; ")},
		{"load average at the start", loadavg()},
	}
}
