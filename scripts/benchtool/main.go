// Command benchtool is the benchmark behind scripts/bench: it measures a
// plain ext4 directory, kernel overlayfs, fuse-overlayfs, go-fuse's
// loopback over the ext4 tree (a reference: loopback.go) and sbxfs (with
// its requests through /dev/fuse, and through io_uring where the kernel
// has it: uring.go) on the same original trees, on the scratch journaled ext4 of
// scripts/bench-disk.sh, and writes a Markdown report with PNG charts
// (docs/bench/README.md says what each number means).
//
// It is not part of sbxfs: it drives the built sbxfs binary as a user
// would and imports none of the project's packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// groups in the order they run; aliases name several.
var groupOrder = []string{
	"metadata", "smallfiles", "copyup", "data", "git", "gobuild",
	"create", "diffcommit", "plan", "memory",
}

var groupAliases = map[string][]string{
	"fs":        {"metadata", "smallfiles", "copyup", "data"},
	"tools":     {"git", "gobuild"},
	"lifecycle": {"create", "diffcommit", "plan", "memory"},
	"all":       groupOrder,
}

type options struct {
	quick   bool
	reps    int
	only    map[string]bool
	out     string
	sbxfs   string
	repo    string
	command string // the command line as the user typed it, for the report
	// rerender redraws the report from out/results.json, measuring nothing.
	rerender bool
}

func main() { os.Exit(run()) }

func run() int {
	if len(os.Args) > 1 && os.Args[1] == serveLoopbackFlag {
		return serveLoopback(os.Args[2:]) // a child serving fuse-loopback
	}
	opt, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if opt.rerender {
		if err := rerender(opt); err != nil {
			fmt.Fprintln(os.Stderr, "bench: --rerender:", err)
			return 1
		}
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: must run as root (mounts, drop_caches); scripts/bench re-runs itself with sudo")
		return 2
	}
	// A signal cancels ctx: running commands are killed, loops stop, and
	// the deferred cleanup unmounts everything before the process exits.
	// A closed stdout or stderr (bench | head) must not kill the process
	// before it has cleaned up: writes then fail instead.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	e := newEnv(ctx, opt)
	defer e.cleanup()
	if err := e.setup(); err != nil {
		e.logf("setup failed: %v", err)
		return 1
	}
	start := time.Now()
	e.res.started = start
	for _, g := range groupOrder {
		if !opt.only[g] {
			continue
		}
		if err := e.runGroup(g); err != nil {
			if ctx.Err() != nil {
				e.logf("interrupted during %s; cleaning up", g)
				return 130
			}
			e.logf("group %s failed: %v", g, err)
			e.res.addError(g, "", err)
		}
	}
	e.res.elapsed = time.Since(start)
	e.res.machine = append(e.res.machine, [2]string{"load average at the end", loadavg()})
	if err := e.report(); err != nil {
		e.logf("writing the report: %v", err)
		return 1
	}
	e.logf("done in %s; results in %s", e.res.elapsed.Round(time.Second), filepath.Join(opt.out, "results.md"))
	if len(e.res.errors) > 0 {
		return 1
	}
	return 0
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "smaller sizes and 1 repetition: a smoke test of a minute or two")
	reps := fs.Int("reps", 0, "repetitions of every measurement (default 3, 1 with --quick)")
	only := fs.String("only", "", "run only these groups (comma separated): "+strings.Join(groupOrder, ", ")+"; or fs, tools, lifecycle")
	out := fs.String("out", "", "directory for results.md, results.json and the charts (default docs/bench; bench-out/ with --quick or --only)")
	sbxfs := fs.String("sbxfs", "", "the sbxfs binary to measure (scripts/bench passes the one it built)")
	repo := fs.String("repo", ".", "the repository root")
	rerenderF := fs.Bool("rerender", false, "measure nothing: write results.md and the charts again from the results.json in --out")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: scripts/bench [--quick] [--reps N] [--only GROUP[,GROUP...]] [--out DIR]\n       scripts/bench --rerender [--out DIR]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	opt := options{quick: *quick, reps: *reps, repo: *repo, only: map[string]bool{}, rerender: *rerenderF}
	if opt.reps < 0 {
		return opt, errors.New("--reps must be at least 1")
	}
	if opt.reps == 0 {
		opt.reps = 3
		if opt.quick {
			opt.reps = 1
		}
	}
	if *only == "" {
		for _, g := range groupOrder {
			opt.only[g] = true
		}
	} else {
		for _, g := range strings.Split(*only, ",") {
			g = strings.TrimSpace(g)
			switch {
			case groupAliases[g] != nil:
				for _, a := range groupAliases[g] {
					opt.only[a] = true
				}
			case slices.Contains(groupOrder, g):
				opt.only[g] = true
			default:
				return opt, fmt.Errorf("unknown group %q; groups: %s (or fs, tools, lifecycle)", g, strings.Join(groupOrder, ", "))
			}
		}
	}
	if *sbxfs == "" && !opt.rerender {
		return opt, errors.New("--sbxfs PATH is required (run scripts/bench, which builds it)")
	}
	var err error
	if opt.sbxfs, err = filepath.Abs(*sbxfs); err != nil {
		return opt, err
	}
	if opt.repo, err = filepath.Abs(opt.repo); err != nil {
		return opt, err
	}
	opt.out = *out
	if opt.out == "" {
		opt.out = filepath.Join(opt.repo, "docs", "bench")
		if (opt.quick || *only != "") && !opt.rerender {
			opt.out = filepath.Join(opt.repo, "bench-out")
		}
	}
	if opt.out, err = filepath.Abs(opt.out); err != nil {
		return opt, err
	}
	// The command as typed, without what the script adds.
	cmd := []string{"scripts/bench"}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "sbxfs", "repo":
		case "quick":
			cmd = append(cmd, "--quick")
		default:
			cmd = append(cmd, "--"+f.Name, f.Value.String())
		}
	})
	opt.command = strings.Join(cmd, " ")
	return opt, nil
}

// devFuseGroups are measured with sbxfs only, through /dev/fuse, as
// they always were: enable_uring is N while they run, so that nothing in
// them (standalone mounts, daemons, the sbxfs commands) meets io_uring.
var devFuseGroups = map[string]bool{"create": true, "diffcommit": true, "plan": true}

// runGroup runs one group: its repetitions, each over every target.
func (e *env) runGroup(g string) error {
	e.logf("== %s", g)
	uring := "Y"
	if devFuseGroups[g] {
		uring = "N"
	}
	if err := e.setURing(uring); err != nil {
		return err
	}
	switch g {
	case "metadata":
		return e.perTarget(g, e.benchMetadata)
	case "smallfiles":
		return e.perTarget(g, e.benchSmallFiles)
	case "copyup":
		return e.perTarget(g, e.benchCopyUp)
	case "data":
		return e.perTarget(g, e.benchData)
	case "git":
		return e.perTarget(g, e.benchGit)
	case "gobuild":
		return e.perTarget(g, e.benchGoBuild)
	case "create":
		return e.benchCreate()
	case "diffcommit":
		return e.benchDiffCommit()
	case "plan":
		return e.benchPlan()
	case "memory":
		return e.benchMemory()
	}
	return fmt.Errorf("no group %q", g)
}

// perTarget runs fn for every repetition and every target, the targets
// interleaved (and their order rotated) within each repetition so that a
// drift of the machine's speed spreads over all of them. Every other
// repetition runs them in reverse, so that no target always runs right
// after the same one (what a target leaves behind, such as dirty pages
// on the scratch disk, would otherwise fall on the same next target).
func (e *env) perTarget(g string, fn func(t *target, rep int) error) error {
	n := len(e.targets)
	for rep := 0; rep < e.opt.reps; rep++ {
		for i := range n {
			j := (i + rep) % n
			if rep%2 == 1 {
				j = (n - 1 - i + rep) % n
			}
			t := e.targets[j]
			if err := e.ctx.Err(); err != nil {
				return err
			}
			e.logf("-- %s rep %d/%d: %s", g, rep+1, e.opt.reps, t.name)
			if err := fn(t, rep); err != nil {
				if e.ctx.Err() != nil {
					return e.ctx.Err()
				}
				e.logf("%s on %s failed: %v", g, t.name, err)
				e.res.addError(g, t.name, err)
			}
		}
	}
	return nil
}
