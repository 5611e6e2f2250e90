package tests

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// privilegeCases are the ways a write, truncate or chown clears the
// set-user-ID and set-group-ID bits of a file on ext4 (or does not): each
// makes its file in root with its mode, then acts on it (util-linux's
// fallocate, coreutils, sh). The mount leaves
// this to sbxfs (FUSE_HANDLE_KILLPRIV_V2), and writes that go by
// passthrough never reach sbxfs.
var privilegeCases = []struct {
	name string
	mode uint32
	caps bool // with a security.capability attribute
	act  func(t *testing.T, p string)
}{
	{"nobody appends to setuid", 0o4777, false, nobodyAppend},
	{"nobody appends to setgid group-exec", 0o2777, false, nobodyAppend},
	{"nobody appends to setgid not group-exec", 0o2767, false, nobodyAppend},
	{"nobody appends to setuid+setgid", 0o6777, false, nobodyAppend},
	{"nobody truncates setuid", 0o4777, false, func(t *testing.T, p string) { nobodyRun(t, "truncate", "-s", "1", p) }},
	{"nobody appends through an fd held across chmod u+s", 0o777, false, nobodyAppendAcrossChmod},
	{"nobody overwrites setuid in place", 0o4777, false, func(t *testing.T, p string) {
		nobodyRun(t, "dd", "if=/dev/zero", "of="+p, "bs=1", "count=1", "conv=notrunc", "status=none")
	}},
	{"nobody fallocates setuid", 0o4777, false, func(t *testing.T, p string) { nobodyRun(t, "fallocate", "-l", "64K", p) }},
	{"nobody punches a hole in setuid", 0o4777, false, func(t *testing.T, p string) {
		nobodyRun(t, "fallocate", "--punch-hole", "-o", "0", "-l", "4096", p)
	}},
	{"root appends to setuid", 0o4777, false, rootAppend},
	{"root truncates setuid", 0o4777, false, func(t *testing.T, p string) { require.NoError(t, os.Truncate(p, 1)) }},
	{"root chowns setuid", 0o4755, false, func(t *testing.T, p string) { require.NoError(t, os.Lchown(p, 1, 1)) }},
	{"root chowns setgid group-exec to -1 -1", 0o2755, false, func(t *testing.T, p string) { require.NoError(t, os.Lchown(p, -1, -1)) }},
	{"root appends to a file with capabilities", 0o755, true, rootAppend},
	{"nobody appends to a file with capabilities", 0o777, true, nobodyAppend},
	{"root chmods setuid, no write", 0o755, false, func(t *testing.T, p string) { require.NoError(t, unix.Chmod(p, 0o4755)) }},
}

func nobodyRun(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := nobodyCmd(t, name, args...).CombinedOutput()
	require.NoError(t, err, "as nobody: %s %v: %s", name, args, out)
}

func nobodyAppend(t *testing.T, p string) { nobodyRun(t, "sh", "-c", `printf more >> "$0"`, p) }

func rootAppend(t *testing.T, p string) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString("more")
	require.NoError(t, f.Close())
	require.NoError(t, err)
}

// nobodyAppendAcrossChmod: nobody opens the file and writes, root sets
// the setuid bit, nobody writes again through the same descriptor (the
// kernel checks privileges at each write, not at open).
func nobodyAppendAcrossChmod(t *testing.T, p string) {
	cmd := nobodyCmd(t, "sh", "-c", `exec 3>>"$0"; printf a >&3; echo ready; read x; printf b >&3`, p)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Wait()
	defer in.Close()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		require.Equal(t, "ready\n", s)
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the writer did not start")
	}
	require.NoError(t, unix.Chmod(p, 0o4777))
	_, err = in.Write([]byte("go\n"))
	require.NoError(t, err)
	in.Close()
	require.NoError(t, cmd.Wait())
}

// capsValue is a security.capability attribute (VFS_CAP_REVISION_2, not
// effective) granting cap_net_bind_service.
var capsValue = []byte{0, 0, 0, 2, 1 << 2, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// privilegeOutcomes runs every case in dir and returns, by case, the mode
// and capability left and the file's size.
func privilegeOutcomes(t *testing.T, dir string) map[string]string {
	got := map[string]string{}
	for i, c := range privilegeCases {
		p := filepath.Join(dir, fmt.Sprintf("case%02d", i))
		require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o600), c.name)
		require.NoError(t, unix.Chmod(p, c.mode), c.name)
		if c.caps {
			require.NoError(t, unix.Setxattr(p, "security.capability", capsValue, 0), c.name)
		}
		c.act(t, p)
		st := lstat(t, p)
		_, err := unix.Getxattr(p, "security.capability", make([]byte, 64))
		got[c.name] = fmt.Sprintf("mode %04o, capability %v, size %d", st.Mode&0o7777, err == nil, st.Size)
	}
	return got
}

// TestWritesClearSetuid: writes, truncates and chowns through the mount
// clear the set-user-ID and set-group-ID bits (and capabilities) exactly
// where they do on a plain directory of the same filesystem, through
// passthrough and without it, and a commit carries the cleared mode.
func TestWritesClearSetuid(t *testing.T) {
	ref := filepath.Join(t.TempDir(), "ref")
	require.NoError(t, os.Mkdir(ref, 0o755))
	openParents(t, ref)
	want := privilegeOutcomes(t, ref)
	// The cases mean something: ext4 clears some bits and keeps others.
	require.Equal(t, "mode 0777, capability false, size 14", want["nobody appends to setuid"])
	require.Equal(t, "mode 4777, capability false, size 14", want["root appends to setuid"])

	for _, mode := range []struct {
		name string
		opts []mountOption
	}{{"passthrough", nil}, {"no passthrough", []mountOption{withNoPassthrough()}}} {
		t.Run(mode.name, func(t *testing.T) {
			orig := newOrig(t, map[string]string{"committed": "#!/bin/sh\n"})
			require.NoError(t, unix.Chmod(filepath.Join(orig, "committed"), 0o4777))
			sb := mountSandbox(t, orig, append(mode.opts, withAllowOther())...)
			openParents(t, sb.mnt)
			got := privilegeOutcomes(t, sb.mnt)
			names := make([]string, 0, len(want))
			for n := range want {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				assert.Equal(t, want[n], got[n], "%s: through the mount and on ext4", n)
			}

			// An original setuid file that nobody appends to is copied up
			// and loses the bit; the commit carries content and mode.
			nobodyAppend(t, sb.path("committed"))
			assert.Equal(t, uint32(0o777), lstat(t, sb.path("committed")).Mode&0o7777)
			r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
			require.Equal(t, 0, r.code, "%s", r)
			st := lstat(t, filepath.Join(orig, "committed"))
			assert.Equal(t, uint32(0o777), st.Mode&0o7777, "mode of the committed file")
			assert.True(t, strings.HasSuffix(mustRead(t, filepath.Join(orig, "committed")), "more"))
		})
	}
}
