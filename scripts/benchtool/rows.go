package main

import "fmt"

const (
	sec = 1.0
	ms  = 1e-3
	mib = 1 << 20
	one = 1.0
)

// compareRows are the measurements made on every target, in report order.
func compareRows(sz sizes) []rowSpec {
	warm := vsOverlay(1.3, true, false)
	cold := vsOverlay(2, true, false)
	small := vsOverlay(3, true, true)
	data := atLeastOverlay(0.9)
	files := commas(sz.metaFiles)
	return []rowSpec{
		{group: "metadata", key: "find.cold", short: "find cold", label: fmt.Sprintf("`find`, %s files, cold", files), unit: "s", scale: sec, goal: cold},
		{group: "metadata", key: "find.warm", short: "find warm", label: fmt.Sprintf("`find`, %s files, warm", files), unit: "s", scale: sec, goal: warm},
		{group: "metadata", key: "stat.cold", short: "stat cold", label: fmt.Sprintf("stat every file, %s, cold", files), unit: "s", scale: sec, goal: cold},
		{group: "metadata", key: "stat.warm", short: "stat warm", label: fmt.Sprintf("stat every file, %s, warm", files), unit: "s", scale: sec, goal: warm},
		{group: "smallfiles", key: "untar", short: "untar", label: fmt.Sprintf("extract a %s-file tarball", commas(sz.tarFiles)), unit: "s", scale: sec, goal: small},
		{group: "smallfiles", key: "rm", short: "rm -rf", label: "`rm -rf` of the extracted tree", unit: "s", scale: sec, goal: small},
		{group: "copyup", key: "append", short: "copy-up", label: fmt.Sprintf("append 1 byte to %s original files", commas(sz.copyupFiles)), unit: "s", scale: sec, goal: vsOverlay(0, true, false)},
		{group: "data", key: "seqwrite", short: "seq write", label: fmt.Sprintf("sequential write %s MiB + fsync", commas(sz.dataMiB)), unit: "MiB/s", scale: mib, higher: true, goal: data},
		{group: "data", key: "smallwrite", short: "4K writes", label: fmt.Sprintf("sequential write %s MiB in 4 KiB writes + fsync", commas(sz.smallMiB)), unit: "MiB/s", scale: mib, higher: true, goal: data},
		{group: "data", key: "readback", short: "read back", label: "cold sequential read of that new file", unit: "MiB/s", scale: mib, higher: true, goal: data},
		{group: "data", key: "readorig", short: "read original", label: fmt.Sprintf("cold sequential read of a %s MiB original file", commas(sz.dataMiB)), unit: "MiB/s", scale: mib, higher: true, goal: data},
		{group: "data", key: "randorig", short: "randread original", label: fmt.Sprintf("4 KiB random reads (fio), %d MiB original file, cold", sz.randMiB), unit: "IOPS", scale: one, higher: true, goal: data},
		{group: "data", key: "randnew", short: "randread new", label: fmt.Sprintf("4 KiB random reads (fio), %d MiB file written in the mount, cold", sz.randMiB), unit: "IOPS", scale: one, higher: true, goal: data},
		{group: "git", key: "status.first", short: "git status 1st", label: fmt.Sprintf("`git status`, %s-file repo, first (cold)", commas(sz.gitFiles)), unit: "s", scale: sec, goal: cold},
		{group: "git", key: "status.warm", short: "git status warm", label: "`git status`, warm", unit: "s", scale: sec, goal: warm},
		{group: "git", key: "commit", short: "git commit", label: fmt.Sprintf("branch + edit %d files + `git add -A` + `git commit`", sz.gitEdits), unit: "s", scale: sec},
		{group: "gobuild", key: "build", short: "go build", label: fmt.Sprintf("`go build ./...`, %d-file module, fresh GOCACHE", sz.goPkgs*sz.goFiles), unit: "s", scale: sec},
	}
}

// createRows: time until a sandbox of an n-file original is usable.
func createRows(sz sizes) []rowSpec {
	g := flat(1.2, 0, 0.050, nCols(sz.lifeN))
	g.text = "flat in n (largest ≤ 1.2× smallest), < 50 ms"
	return []rowSpec{
		{group: "create", key: "mount", label: "`sbxfs mount` (standalone; returns once live)", unit: "ms", scale: ms, goal: g},
		{group: "create", key: "create", label: "`sbxfs create` (daemon running)", unit: "ms", scale: ms, goal: g},
	}
}

// diffCommitRows: diff and commit of k touched files.
func diffCommitRows(sz sizes) []rowSpec {
	var rows []rowSpec
	for _, op := range []string{"diff", "commit"} {
		for _, fs := range []string{"same", "other"} {
			for _, k := range sz.lifeK {
				where := "upper on the same fs"
				if fs == "other" {
					where = "upper on tmpfs"
				}
				rows = append(rows, rowSpec{
					group: "diffcommit", key: fmt.Sprintf("%s.%s.k%d", op, fs, k),
					label: fmt.Sprintf("`sbxfs %s`, k = %s, %s", op, commas(k), where),
					unit:  "ms", scale: ms,
					goal: flat(1.25, 0.005, 0, nCols(sz.lifeN)),
				})
			}
		}
	}
	return rows
}

func planRows(sz sizes) []rowSpec {
	return []rowSpec{
		{group: "plan", key: "commit", label: fmt.Sprintf("`sbxfs commit --plan`: %d sandboxes × %d changed files", sz.planSandboxes, sz.planFiles), unit: "s", scale: sec},
	}
}

// memoryRows: VmRSS of the serving processes.
func memoryRows(sz sizes) []rowSpec {
	n := commas(sz.lifeN[len(sz.lifeN)-1])
	return []rowSpec{
		{group: "memory", key: "idle", label: fmt.Sprintf("server RSS, just mounted (%s-file original)", n), unit: "MiB", scale: mib},
		{group: "memory", key: "walk1", label: fmt.Sprintf("after walking (lstat) all %s files", n), unit: "MiB", scale: mib},
		{group: "memory", key: "forget", label: "after `echo 2 > drop_caches` (the kernel forgets the inodes), 3 s later", unit: "MiB", scale: mib},
		{group: "memory", key: "walk2", label: "after a second walk", unit: "MiB", scale: mib,
			goal: noGrowth("walk1", 1.25, 16*mib, "sbxfs", "bounded: ≤ 1.25× after the first walk + 16 MiB")},
		{group: "memory", key: "walktime", label: fmt.Sprintf("time of the first walk (%s lstat, cold)", n), unit: "s", scale: sec},
	}
}

func daemonRows(sz sizes) []rowSpec {
	return []rowSpec{
		{group: "memory", key: "daemon.idle", label: "daemon RSS, no sandboxes", unit: "MiB", scale: mib},
		{group: "memory", key: "daemon.loaded", label: fmt.Sprintf("daemon RSS with %d idle sandboxes", sz.idleSandboxes), unit: "MiB", scale: mib,
			goal: below(512*mib, "sbxfs", "well under 1 GiB: < 512 MiB")},
		{group: "memory", key: "daemon.per", label: "RSS per idle sandbox", unit: "KiB", scale: 1024},
		{group: "memory", key: "daemon.create", label: fmt.Sprintf("`sbxfs create`, median of the %d", sz.idleSandboxes), unit: "ms", scale: ms},
		{group: "memory", key: "daemon.destroy", label: fmt.Sprintf("`sbxfs destroy --plan` of the %d", sz.idleSandboxes), unit: "s", scale: sec},
	}
}
