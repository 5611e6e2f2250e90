package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/fuse"
	"github.com/sbxfs/sbxfs/layers"
)

// The mount helper form. mount(8) runs
//
//	/sbin/mount.fuse.sbxfs SOURCE MOUNTPOINT [-n] [-v] [-s] [-f] -o OPTIONS
//
// for "mount -t fuse.sbxfs" and fstab lines of that type, and mount.fuse3
// runs "sbxfs SOURCE MOUNTPOINT -o OPTIONS". The options name the layers as
// for kernel overlayfs: lowerdir=A:B:C (top first; A is the original),
// upperdir=U, workdir=W. SOURCE is only a label.
const helperUsage = "mount -t fuse.sbxfs sbxfs MOUNTPOINT -o lowerdir=ORIGINAL,upperdir=UPPER,workdir=WORK"

// helperArgs is a parsed helper command line.
type helperArgs struct {
	source, mountpoint string
	opts               string // every -o value, joined with ","
	foreground         bool   // -f
}

// helperNames are the names under which sbxfs is a mount helper.
var helperNames = map[string]bool{"mount.fuse.sbxfs": true, "mount.sbxfs": true}

// isHelperInvocation tells whether argv is the mount helper form: sbxfs
// runs as mount.fuse.sbxfs or mount.sbxfs, or it got SOURCE MOUNTPOINT -o
// OPTIONS where SOURCE is not a subcommand (then -o must name lowerdir=).
func isHelperInvocation(argv0 string, args []string, commands map[string]bool) bool {
	if helperNames[filepath.Base(argv0)] {
		return true
	}
	if len(args) == 0 {
		return false
	}
	h, err := parseHelperArgs(args)
	if err != nil || h.opts == "" {
		return false
	}
	if commands[args[0]] || strings.HasPrefix(args[0], "-") {
		return strings.Contains(h.opts, "lowerdir=")
	}
	return true
}

// parseHelperArgs parses the helper command line (without argv[0]).
func parseHelperArgs(args []string) (helperArgs, error) {
	var h helperArgs
	var pos, opts []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case a == "-o":
			if i+1 == len(args) {
				return h, failf(exitUsage, "-o needs a value; usage: %s", helperUsage)
			}
			i++
			opts = append(opts, args[i])
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, a[2:])
		case a == "-t" || a == "-N":
			i++ // type (always fuse.sbxfs) or namespace: nothing to do
		case a == "-f":
			h.foreground = true
		case a == "-n" || a == "-v" || a == "-s":
			// no mtab, verbose, sloppy: nothing to do
		case strings.HasPrefix(a, "-") && len(a) > 1:
			return h, failf(exitUsage, "unknown argument %q; usage: %s", a, helperUsage)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return h, failf(exitUsage, "expected SOURCE and MOUNTPOINT, got %d argument(s); usage: %s", len(pos), helperUsage)
	}
	h.source, h.mountpoint = pos[0], pos[1]
	h.opts = strings.Join(opts, ",")
	return h, nil
}

// mountOptions are the parsed -o options of the helper form.
type mountOptions struct {
	lowers      []string
	upper, work string
	allowOther  bool
	dev, suid   bool
}

// ignoredOptions are the generic options mount(8) and mount.fuse3 may
// pass that mean nothing to sbxfs (nodev and nosuid are its defaults and
// default_permissions is always on).
var ignoredOptions = map[string]bool{
	"rw": true, "defaults": true, "auto": true, "noauto": true,
	"user": true, "nouser": true, "users": true, "owner": true, "group": true,
	"exec": true, "noexec": true, "async": true, "sync": true,
	"atime": true, "noatime": true, "relatime": true, "norelatime": true,
	"strictatime": true, "nostrictatime": true, "diratime": true, "nodiratime": true,
	"lazytime": true, "nolazytime": true,
	"nodev": true, "nosuid": true, "_netdev": true, "nofail": true,
	"default_permissions": true,
}

// ignoredPrefixes are options with a value that sbxfs accepts and ignores:
// the file system name and subtype (the mount source is always the work
// directory, so status and unmount can find the sandbox), and the user=
// and comment= that mount(8) adds for fstab user mounts.
var ignoredPrefixes = []string{"fsname=", "subtype=", "user=", "comment=", "x-"}

// parseMountOptions parses a comma-separated option string. A backslash
// escapes the next character, so paths may hold "," (and ":" in lowerdir).
func parseMountOptions(s string) (mountOptions, error) {
	var o mountOptions
	for _, opt := range splitEscaped(s, ',') {
		key, val, hasVal := strings.Cut(opt, "=")
		switch {
		case opt == "":
		case key == "lowerdir" && hasVal:
			o.lowers = nil
			for _, l := range splitEscaped(val, ':') {
				o.lowers = append(o.lowers, unescapeOption(l))
			}
		case key == "upperdir" && hasVal:
			o.upper = unescapeOption(val)
		case key == "workdir" && hasVal:
			o.work = unescapeOption(val)
		case opt == "ro":
			return o, failf(exitUsage, "mount option \"ro\" is refused: an sbxfs sandbox is always writable (changes go to upperdir, never to the original); remove \"ro\"")
		case opt == "allow_other":
			o.allowOther = true
		case opt == "dev" || opt == "nodev":
			o.dev = opt == "dev"
		case opt == "suid" || opt == "nosuid":
			o.suid = opt == "suid"
		case ignoredOptions[opt] || hasIgnoredPrefix(opt):
		default:
			return o, failf(exitUsage, "unknown mount option %q; sbxfs takes lowerdir=, upperdir=, workdir= and the generic mount options (see 'sbxfs help')", unescapeOption(opt))
		}
	}
	for _, l := range o.lowers {
		if l == "" {
			return o, failf(exitUsage, "empty layer in lowerdir=; give lowerdir=DIR[:DIR...]")
		}
	}
	switch {
	case len(o.lowers) == 0:
		return o, failf(exitUsage, "mount option lowerdir= is missing; usage: %s", helperUsage)
	case o.upper == "":
		return o, failf(exitUsage, "mount option upperdir= is missing; usage: %s", helperUsage)
	case o.work == "":
		return o, failf(exitUsage, "mount option workdir= is missing; usage: %s", helperUsage)
	}
	return o, nil
}

func hasIgnoredPrefix(opt string) bool {
	for _, p := range ignoredPrefixes {
		if strings.HasPrefix(opt, p) {
			return true
		}
	}
	return false
}

// splitEscaped splits s at every sep not preceded by a backslash, keeping
// the escapes in the parts.
func splitEscaped(s string, sep byte) []string {
	var parts []string
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// unescapeOption removes the backslash escapes of an option value.
func unescapeOption(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// escapeOption escapes the characters the option syntax uses.
func escapeOption(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `,`, `\,`, `:`, `\:`)
	return r.Replace(s)
}

// format returns the option string of o, with every path escaped.
func (o *mountOptions) format() string {
	lowers := make([]string, len(o.lowers))
	for i, l := range o.lowers {
		lowers[i] = escapeOption(l)
	}
	s := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + escapeOption(o.upper) + ",workdir=" + escapeOption(o.work)
	for _, f := range []struct {
		on   bool
		name string
	}{{o.allowOther, "allow_other"}, {o.dev, "dev"}, {o.suid, "suid"}} {
		if f.on {
			s += "," + f.name
		}
	}
	return s
}

// runHelper mounts the helper form; it backgrounds unless -f was given.
func runHelper(args []string) error {
	h, err := parseHelperArgs(args)
	if err != nil {
		return err
	}
	o, err := parseMountOptions(h.opts)
	if err != nil {
		return err
	}
	if err := o.resolve(); err != nil {
		return err
	}
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return err
	}
	mnt, err := checkMountpoint(mounts, h.mountpoint)
	if err != nil {
		return err
	}
	lay := layout{mountpoint: mnt, lowers: o.lowers, upper: o.upper, work: o.work}
	if err := lay.check(); err != nil {
		return err
	}
	if err := checkSandboxFree(mounts, o.work); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		// As with kernel overlayfs, other users use a mount root made,
		// subject to the usual permission checks.
		o.allowOther = true
	}
	if err := checkWorkFiles(o.work); err != nil {
		return err
	}
	cfg := layers.Config{Upper: o.upper, Work: o.work, Lowers: o.lowers, Journal: filepath.Join(o.work, "journal")}
	if err := bindLayers(&cfg); err != nil {
		return err
	}
	spec := &mountSpec{cfg: fuse.Config{
		Layers:     cfg,
		Mountpoint: mnt,
		FsName:     o.work,
		AllowOther: o.allowOther,
		Dev:        o.dev,
		Suid:       o.suid,
	}}
	if h.foreground {
		return serve(spec, os.Stdout)
	}
	child := []string{"mount.fuse.sbxfs", h.source, mnt, "-f", "-o", o.format()}
	return startBackground(child, serverLog(o.work))
}

// resolve makes every directory absolute with its symlinks resolved.
func (o *mountOptions) resolve() error {
	for i, l := range o.lowers {
		role := "original (first lowerdir)"
		if i > 0 {
			role = fmt.Sprintf("lowerdir %d", i+1)
		}
		real, err := resolveDir(role, l, "give existing directories in lowerdir=")
		if err != nil {
			return err
		}
		o.lowers[i] = real
	}
	var err error
	if o.upper, err = resolveDir("upperdir", o.upper, "create it first (mkdir -p)"); err != nil {
		return err
	}
	if o.work, err = resolveDir("workdir", o.work, "create it first (mkdir -p), on the same file system as upperdir"); err != nil {
		return err
	}
	return nil
}
