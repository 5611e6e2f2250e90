package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
		Charting: "scripts/bench --rerender --out DIR redraws results.md and the charts from this file",
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(e.opt.out, "results.json"), append(j, '\n'), 0o644)
}

// savedResults is results.json.
type savedResults struct {
	Date     string               `json:"date"`
	Elapsed  float64              `json:"elapsed_s"`
	Command  string               `json:"command"`
	Reps     int                  `json:"reps"`
	Quick    bool                 `json:"quick"`
	Machine  [][2]string          `json:"machine"`
	Samples  map[string][]float64 `json:"samples"`
	Errors   []string             `json:"errors"`
	Charting string               `json:"note"`
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
	return e.report()
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
	var missed, met, unknown []string
	for _, s := range sections {
		for _, row := range s.rows {
			if row.goal == nil || !e.ran(row.group) {
				continue
			}
			get := func(r, c string) (float64, bool) { return e.res.median(row.group, r, c) }
			ok, known, why := row.goal.eval(get, row)
			name := stripTicks(row.label) + paren(why)
			switch {
			case !known:
				unknown = append(unknown, name)
			case ok:
				met = append(met, name)
			default:
				missed = append(missed, name)
			}
		}
	}
	fmt.Fprintf(&b, "## Targets\n\n%d met, %d missed", len(met), len(missed))
	if len(unknown) > 0 {
		fmt.Fprintf(&b, ", %d not measured", len(unknown))
	}
	fmt.Fprintf(&b, " (the targets of issue 5, checked on the medians below).\n\n")
	for _, m := range missed {
		fmt.Fprintf(&b, "* missed: %s\n", m)
	}
	if len(missed) > 0 {
		b.WriteString("\n")
	}
	for _, s := range sections {
		if !e.anyRan(s.rows) {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", s.title, s.intro)
		switch s.kind {
		case tableCompare:
			e.compareTable(&b, s.rows)
		case tableScaling:
			e.scalingTable(&b, s.rows)
		case tableColumns:
			e.columnsTable(&b, s.rows, s.cols)
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
	cols         []string
	chart        string // chart file prefix
}

func (e *env) sections() []section {
	sz := e.sz
	return []section{
		{title: "Filesystem workloads", kind: tableCompare, rows: compareRows(sz), chart: "compare",
			intro: "Median of each target, and in parentheses its ratio to kernel overlayfs (for times, > 1× is slower; " +
				"for MiB/s and IOPS, < 1× is slower). ↓: lower is better, ↑: higher is better. " +
				"The target column is the issue's target for sbxfs."},
		{title: "sbxfs: create", kind: tableScaling, rows: createRows(sz), chart: "lifecycle",
			intro: "Time of the command until the sandbox is usable, for originals of n files (ms)."},
		{title: "sbxfs: diff and commit", kind: tableScaling, rows: diffCommitRows(sz),
			intro: "Time of `sbxfs diff` (whole patch) and `sbxfs commit` of k files changed through the mount, " +
				"originals of n files (ms); the upper on the scratch ext4 (commit renames) or on a tmpfs (commit copies)."},
		{title: "sbxfs: plan commit", kind: tableColumns, rows: planRows(sz), cols: []string{"sbxfs"},
			intro: "Sandboxes made with `sbxfs create --plan` (daemon, private `--state-dir`), files changed through their mounts, then `sbxfs commit --plan`."},
		{title: "sbxfs: memory", kind: tableColumns, rows: memoryRows(sz), cols: []string{"sbxfs", "fuse-overlayfs"}, chart: "memory",
			intro: "VmRSS of the process serving the mount (`sbxfs mount`'s server; fuse-overlayfs for comparison)."},
		{title: "sbxfs: daemon with idle sandboxes", kind: tableColumns, rows: daemonRows(sz), cols: []string{"sbxfs"},
			intro: "VmRSS of `sbxfs daemon` (private state root) before and after `sbxfs create` of idle sandboxes of a small original."},
	}
}

func (e *env) compareTable(b *strings.Builder, rows []rowSpec) {
	fmt.Fprintf(b, "| measurement | unit |")
	for _, t := range targets {
		fmt.Fprintf(b, " %s |", t.name)
	}
	fmt.Fprintf(b, " target (sbxfs) | |\n| --- | --- |")
	for range targets {
		b.WriteString(" ---: |")
	}
	b.WriteString(" --- | --- |\n")
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
		for _, t := range targets {
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
		text, verdict := "—", ""
		if row.goal != nil {
			text, verdict = row.goal.text, row.goal.verdict(get, row)
		}
		fmt.Fprintf(b, " %s | %s |\n", text, verdict)
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

func (e *env) columnsTable(b *strings.Builder, rows []rowSpec, cols []string) {
	fmt.Fprintf(b, "| measurement | unit |")
	for _, c := range cols {
		fmt.Fprintf(b, " %s |", c)
	}
	fmt.Fprintf(b, " target | |\n| --- | --- |")
	for range cols {
		b.WriteString(" ---: |")
	}
	b.WriteString(" --- | --- |\n")
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
		text, verdict := "—", ""
		if row.goal != nil {
			text, verdict = row.goal.text, row.goal.verdict(get, row)
		}
		fmt.Fprintf(b, " %s | %s |\n", text, verdict)
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
