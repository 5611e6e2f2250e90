package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const layersOpts = "lowerdir=/l,upperdir=/u,workdir=/w"

func TestParseMountOptionsGeneric(t *testing.T) {
	t.Parallel()
	generic := []string{
		"rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group",
		"exec", "noexec", "atime", "noatime", "relatime", "norelatime", "strictatime",
		"nostrictatime", "diratime", "nodiratime", "lazytime", "nolazytime",
		"dev", "nodev", "suid", "nosuid", "async", "sync", "_netdev", "nofail",
		"allow_other", "default_permissions", "x-systemd.automount", "x-gvfs-show",
		"fsname=mysandbox", "subtype=sbxfs", "user=alice", "comment=systemd.automount",
	}
	for _, opt := range generic {
		t.Run(opt, func(t *testing.T) {
			o, err := parseMountOptions(layersOpts + "," + opt)
			require.NoError(t, err)
			assert.Equal(t, []string{"/l"}, o.lowers)
			assert.Equal(t, "/u", o.upper)
			assert.Equal(t, "/w", o.work)
		})
	}
}

func TestParseMountOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		opts    string
		want    mountOptions
		errCode int
		errText string
	}{
		{name: "minimal", opts: layersOpts,
			want: mountOptions{lowers: []string{"/l"}, upper: "/u", work: "/w"}},
		{name: "several lowers, top first", opts: "lowerdir=/a:/b:/c,upperdir=/u,workdir=/w",
			want: mountOptions{lowers: []string{"/a", "/b", "/c"}, upper: "/u", work: "/w"}},
		{name: "escaped comma and colon", opts: `lowerdir=/a\:1:/b\,2,upperdir=/u\\x,workdir=/w`,
			want: mountOptions{lowers: []string{"/a:1", "/b,2"}, upper: `/u\x`, work: "/w"}},
		{name: "order free, empty options skipped", opts: "rw,,workdir=/w,upperdir=/u,lowerdir=/l,",
			want: mountOptions{lowers: []string{"/l"}, upper: "/u", work: "/w"}},
		{name: "dev suid allow_other honoured", opts: layersOpts + ",dev,suid,allow_other",
			want: mountOptions{lowers: []string{"/l"}, upper: "/u", work: "/w", dev: true, suid: true, allowOther: true}},
		{name: "last of dev/nodev wins", opts: layersOpts + ",dev,nodev,nosuid,suid",
			want: mountOptions{lowers: []string{"/l"}, upper: "/u", work: "/w", suid: true}},
		{name: "unknown option", opts: layersOpts + ",bogus", errCode: exitUsage, errText: `unknown mount option "bogus"`},
		{name: "unknown option with value", opts: layersOpts + ",uid=0", errCode: exitUsage, errText: `unknown mount option "uid=0"`},
		{name: "ro refused", opts: layersOpts + ",ro", errCode: exitUsage, errText: "always writable"},
		{name: "missing lowerdir", opts: "upperdir=/u,workdir=/w", errCode: exitUsage, errText: "lowerdir= is missing"},
		{name: "missing upperdir", opts: "lowerdir=/l,workdir=/w", errCode: exitUsage, errText: "upperdir= is missing"},
		{name: "missing workdir", opts: "lowerdir=/l,upperdir=/u", errCode: exitUsage, errText: "workdir= is missing"},
		{name: "empty layer", opts: "lowerdir=/a::/b,upperdir=/u,workdir=/w", errCode: exitUsage, errText: "empty layer"},
		{name: "key without value", opts: "lowerdir,upperdir=/u,workdir=/w", errCode: exitUsage, errText: `unknown mount option "lowerdir"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMountOptions(tt.opts)
			if tt.errText != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.errText)
				assert.Equal(t, tt.errCode, exitCode(err))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestMountOptionsFormatRoundTrip(t *testing.T) {
	t.Parallel()
	o := mountOptions{lowers: []string{"/a:b", `/c,d\e`}, upper: "/u,1", work: "/w:2", allowOther: true, suid: true}
	got, err := parseMountOptions(o.format())
	require.NoError(t, err)
	assert.Equal(t, o, got)
}

func TestParseHelperArgs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		want    helperArgs
		errText string
	}{
		{name: "mount.fuse3 form", args: []string{"sbxfs", "/mnt", "-o", "rw,lowerdir=/l"},
			want: helperArgs{source: "sbxfs", mountpoint: "/mnt", opts: "rw,lowerdir=/l"}},
		{name: "mount(8) flags", args: []string{"src", "/mnt", "-n", "-v", "-s", "-o", "a", "-ob"},
			want: helperArgs{source: "src", mountpoint: "/mnt", opts: "a,b"}},
		{name: "-f stays in the foreground", args: []string{"src", "/mnt", "-f", "-o", "a"},
			want: helperArgs{source: "src", mountpoint: "/mnt", opts: "a", foreground: true}},
		{name: "-t is accepted", args: []string{"-t", "fuse.sbxfs", "src", "/mnt", "-o", "a"},
			want: helperArgs{source: "src", mountpoint: "/mnt", opts: "a"}},
		{name: "unknown flag", args: []string{"src", "/mnt", "-x"}, errText: `unknown argument "-x"`},
		{name: "missing mountpoint", args: []string{"src", "-o", "a"}, errText: "expected SOURCE and MOUNTPOINT"},
		{name: "-o without value", args: []string{"src", "/mnt", "-o"}, errText: "-o needs a value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseHelperArgs(tt.args)
			if tt.errText != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.errText)
				assert.Equal(t, exitUsage, exitCode(err))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestIsHelperInvocation(t *testing.T) {
	t.Parallel()
	cmds := map[string]bool{"mount": true, "unmount": true, "status": true, "help": true}
	tests := []struct {
		argv0 string
		args  []string
		want  bool
	}{
		{"/sbin/mount.fuse.sbxfs", []string{"sbxfs", "/mnt", "-o", "x"}, true},
		{"mount.sbxfs", nil, true},
		{"sbxfs", []string{"sbxfs", "/mnt", "-o", "lowerdir=/l"}, true},
		{"sbxfs", []string{"mysrc", "/mnt", "-o", "rw"}, true},
		{"sbxfs", []string{"mount", "/o", "/mnt"}, false},
		{"sbxfs", []string{"mount", "--upper", "/d", "/o", "/mnt"}, false},
		{"sbxfs", []string{"status", "/mnt", "-o", "rw"}, false},
		{"sbxfs", []string{"status", "/mnt", "-o", "lowerdir=/l"}, true},
		{"sbxfs", []string{"--version"}, false},
		{"sbxfs", []string{"a", "b"}, false},
		{"sbxfs", []string{"a", "b", "c", "-o", "x"}, false},
		{"sbxfs", nil, false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, isHelperInvocation(tt.argv0, tt.args, cmds), "%s %q", tt.argv0, tt.args)
	}
}
