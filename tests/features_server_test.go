package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// TestNosuidNodev: a setuid-root program in the mount does not run as
// root, a device node in the mount cannot be opened, and mountinfo says
// nosuid,nodev.
func TestNosuidNodev(t *testing.T) {
	orig := newOrig(t, nil)
	// allow_other: nobody must be able to reach the mount at all.
	sb := mountSandbox(t, orig, withAllowOther())
	e, ok := mountAt(sb.mnt)
	require.True(t, ok)
	opts := strings.Split(e.options, ",")
	assert.Contains(t, opts, "nosuid", "mount options %s", e.options)
	assert.Contains(t, opts, "nodev", "mount options %s", e.options)

	idPath, err := exec.LookPath("id")
	require.NoError(t, err)
	idBin, err := os.ReadFile(idPath)
	require.NoError(t, err)
	install := func(p string) {
		require.NoError(t, os.WriteFile(p, idBin, 0o755))
		require.NoError(t, os.Lchown(p, 0, 0))
		require.NoError(t, unix.Chmod(p, 0o4755))
	}
	runAsNobody := func(p string) string {
		out, err := runTimeout(10*time.Second, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", p, "-u")
		require.NoError(t, err, "setpriv ... %s -u: %s", p, out)
		return strings.TrimSpace(string(out))
	}
	uid, _ := nobodyIDs(t)

	// Control: the same program outside the mount does run as root, so
	// the check below means something.
	ctl := filepath.Join(t.TempDir(), "ctl")
	require.NoError(t, os.Mkdir(ctl, 0o755))
	openParents(t, ctl)
	install(filepath.Join(ctl, "id"))
	control := runAsNobody(filepath.Join(ctl, "id"))

	openParents(t, sb.mnt)
	install(sb.path("id"))
	assert.Equal(t, uint32(0o4755), lstat(t, sb.path("id")).Mode&0o7777, "the setuid bit is kept (only not honoured)")
	got := runAsNobody(sb.path("id"))
	assert.Equal(t, fmt.Sprint(uid), got, "a setuid-root program in the mount ran with euid %s", got)
	if control != "0" {
		t.Logf("control: setuid outside the mount gave euid %s here (nosuid there too?)", control)
	}

	require.NoError(t, unix.Mknod(sb.path("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	_, err = os.OpenFile(sb.path("null"), os.O_WRONLY, 0)
	assert.ErrorIs(t, err, unix.EACCES, "opening a device node in a nodev mount")
}

// TestPermissionBitsZero: an object whose permission bits are all 0 shows
// mode 0 through the mount, and nobody else may read it.
func TestPermissionBitsZero(t *testing.T) {
	orig := newOrig(t, map[string]string{"zero.txt": "secret", "zdir/f": "f"})
	require.NoError(t, os.Chmod(filepath.Join(orig, "zero.txt"), 0))
	require.NoError(t, os.Chmod(filepath.Join(orig, "zdir"), 0))
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	assert.Equal(t, uint32(0), lstat(t, sb.path("zero.txt")).Mode&0o7777, "original file with mode 0")
	assert.Equal(t, uint32(0), lstat(t, sb.path("zdir")).Mode&0o7777, "original directory with mode 0")
	fd, err := unix.Open(sb.path("new0"), unix.O_CREAT|unix.O_WRONLY, 0)
	require.NoError(t, err)
	unix.Close(fd)
	assert.Equal(t, uint32(0), lstat(t, sb.path("new0")).Mode&0o7777, "file created with mode 0")
	require.NoError(t, os.WriteFile(sb.path("chmod0"), nil, 0o644))
	require.NoError(t, os.Chmod(sb.path("chmod0"), 0))
	assert.Equal(t, uint32(0), lstat(t, sb.path("chmod0")).Mode&0o7777, "file after chmod 0")
	require.NoError(t, unix.Mkdir(sb.path("dir0"), 0))
	assert.Equal(t, uint32(0), lstat(t, sb.path("dir0")).Mode&0o7777, "directory made with mode 0")

	t.Run("other users", func(t *testing.T) {
		// With allow_other, the kernel checks permissions on the modes the
		// mount reports: a mode 0 file must stay unreadable for nobody.
		orig := newOrig(t, map[string]string{"zero.txt": "secret"})
		require.NoError(t, os.Chmod(filepath.Join(orig, "zero.txt"), 0))
		sb := mountSandbox(t, orig, withAllowOther())
		openParents(t, sb.mnt)
		out, err := nobodyCmd(t, "cat", sb.path("zero.txt")).CombinedOutput()
		assert.Error(t, err, "nobody read a mode 0 root file through the mount: %q", out)
	})
}

// statusChanges reads the change set as status lists it with `sbxfs
// status --json` (when the CLI serves) and with layers.Changes and
// Listing; both must agree.
func statusChanges(t *testing.T, sb *sandbox) []layers.Change {
	t.Helper()
	cs, err := layers.Changes(sb.layersConfig())
	require.NoError(t, err, "layers.Changes")
	listing := cs.Listing()
	for i := range listing {
		listing[i].Original = "" // status names the path, now an original one
	}
	if sb.useStandIn() {
		return listing
	}
	out, err := runTimeout(20*time.Second, cliBin, "status", "--json", sb.mnt)
	require.NoError(t, err, "sbxfs status --json: %s", out)
	var st struct {
		Changes []layers.Change `json:"changes"`
	}
	require.NoError(t, json.Unmarshal(out, &st), "status output: %s", out)
	assert.Equal(t, listing, st.Changes, "sbxfs status --json and layers.Changes disagree")
	return st.Changes
}

// TestChangeSet: the change set lists what a user changed, and only that.
func TestChangeSet(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"keep.txt": "keep", "mod.txt": "mod", "meta.txt": "meta", "del.txt": "del", "old.txt": "old",
		"deldir/x.txt": "x", "deldir/y/z.txt": "z", "olddir/c.txt": "c", "touched.txt": "t",
	})
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	m := sb.path
	mustRead(t, m("keep.txt"))
	require.NoError(t, os.WriteFile(m("new.txt"), []byte("new"), 0o644))
	require.NoError(t, appendFile(m("mod.txt"), []byte("+")))
	require.NoError(t, os.Chmod(m("meta.txt"), 0o600))
	require.NoError(t, os.Remove(m("del.txt")))
	require.NoError(t, os.Rename(m("old.txt"), m("renamed.txt")))
	require.NoError(t, os.Mkdir(m("newdir"), 0o755))
	require.NoError(t, os.WriteFile(m("newdir/inner.txt"), []byte("i"), 0o644))
	require.NoError(t, os.RemoveAll(m("deldir")))
	require.NoError(t, os.Rename(m("olddir"), m("newname")))
	require.NoError(t, os.Symlink("keep.txt", m("sym")))
	require.NoError(t, os.Link(m("new.txt"), m("new-link")))
	// Opened for writing but left as it was: no change.
	f, err := os.OpenFile(m("touched.txt"), os.O_WRONLY, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	got := map[string]layers.Change{}
	for _, c := range statusChanges(t, sb) {
		got[c.Path] = c
	}
	want := []layers.Change{
		{Path: "new.txt", Kind: layers.Created, Type: "file"},
		{Path: "new-link", Kind: layers.Linked, From: "new.txt", Type: "file"},
		{Path: "mod.txt", Kind: layers.Modified, Type: "file"},
		{Path: "meta.txt", Kind: layers.Metadata, Type: "file"},
		{Path: "del.txt", Kind: layers.Deleted, Type: "file"},
		{Path: "renamed.txt", Kind: layers.Renamed, From: "old.txt", Type: "file"},
		{Path: "newdir", Kind: layers.Created, Type: "dir"},
		{Path: "newdir/inner.txt", Kind: layers.Created, Type: "file"},
		{Path: "deldir", Kind: layers.Deleted, Type: "dir"},
		{Path: "newname", Kind: layers.Renamed, From: "olddir", Type: "dir"},
		{Path: "sym", Kind: layers.Created, Type: "symlink"},
	}
	for _, w := range want {
		assert.Equal(t, w, got[w.Path], "change of %s", w.Path)
		delete(got, w.Path)
	}
	for p, c := range got {
		// The old names of renamed objects and the contents of deleted
		// directories may be listed as deleted; nothing else may appear.
		if c.Kind == layers.Deleted && (p == "old.txt" || p == "olddir" || strings.HasPrefix(p, "deldir/")) {
			continue
		}
		t.Errorf("unexpected change %+v", c)
	}
}

// TestJournalSurvivesSIGKILL: every change that returned before the
// server was SIGKILLed is in the journal and in the upper; the dead mount
// can be cleaned up, and the same upper mounted again.
func TestJournalSurvivesSIGKILL(t *testing.T) {
	files := map[string]string{}
	for i := range 40 {
		files[fmt.Sprintf("o-%02d", i)] = fmt.Sprintf("original %d", i)
	}
	orig := newOrig(t, files)
	originalGuard(t, orig)
	sb := mountSandbox(t, orig, allowServerErrors())

	type done struct {
		op          layers.Op
		path, path2 string
	}
	var (
		mu        sync.Mutex
		completed []done
	)
	stop := make(chan struct{})
	finished := make(chan error, 1)
	go func() {
		record := func(op layers.Op, p1, p2 string) {
			mu.Lock()
			completed = append(completed, done{op, p1, p2})
			mu.Unlock()
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				finished <- nil
				return
			default:
			}
			name := fmt.Sprintf("new-%04d", i)
			if err := os.WriteFile(sb.path(name), []byte("content "+name), 0o644); err != nil {
				finished <- err
				return
			}
			record(layers.OpCreate, name, "")
			var err error
			switch {
			case i%3 == 0:
				d := fmt.Sprintf("dir-%04d", i)
				if err = os.Mkdir(sb.path(d), 0o755); err == nil {
					record(layers.OpMkdir, d, "")
				}
			case i%5 == 1 && i/5 < 40:
				o := fmt.Sprintf("o-%02d", i/5)
				if err = os.Remove(sb.path(o)); err == nil {
					record(layers.OpUnlink, o, "")
				}
			case i%7 == 2:
				r := fmt.Sprintf("ren-%04d", i)
				if err = os.Rename(sb.path(name), sb.path(r)); err == nil {
					record(layers.OpRename, name, r)
				}
			}
			if err != nil {
				finished <- err
				return
			}
		}
	}()
	time.Sleep(400 * time.Millisecond)
	sb.kill(t)
	close(stop)
	select {
	case err := <-finished:
		t.Logf("the operations stopped with %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("an operation hangs on the dead mount")
	}
	mu.Lock()
	ops := slices.Clone(completed)
	mu.Unlock()
	require.NotEmpty(t, ops, "no operation completed before the kill")
	t.Logf("%d operations completed before the kill", len(ops))

	// opendir always reaches the server (a stat may be answered from the
	// kernel's attribute cache).
	if fd, err := unix.Open(sb.mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
		unix.Close(fd)
		t.Errorf("opendir of the dead mount succeeded")
	} else if !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.ECONNABORTED) {
		// ECONNABORTED: a request made while the kernel tears down the
		// io_uring queues of the killed server.
		t.Errorf("opendir of the dead mount: %v, want ENOTCONN (or ECONNABORTED)", err)
	}
	var st unix.Stat_t

	recs, err := layers.ReadJournal(filepath.Join(sb.work, "journal"))
	require.NoError(t, err)
	have := map[string]bool{}
	for _, r := range recs {
		have[fmt.Sprintf("%s %s %s", r.Op, r.Path, r.Path2)] = true
	}
	renamed := map[string]string{}
	for _, d := range ops {
		if d.op == layers.OpRename {
			renamed[d.path] = d.path2
		}
	}
	missing := 0
	for _, d := range ops {
		key := fmt.Sprintf("%s %s %s", d.op, d.path, d.path2)
		if !have[key] {
			if missing++; missing <= 10 {
				t.Errorf("journal lacks a completed operation: %s", key)
			}
		}
		switch d.op {
		case layers.OpCreate:
			p := d.path
			if r, ok := renamed[p]; ok {
				p = r
			}
			b, err := os.ReadFile(sb.upperPath(p))
			if assert.NoError(t, err, "created file %s not in the upper", p) {
				assert.Equal(t, "content "+d.path, string(b), "content of %s in the upper", p)
			}
		case layers.OpMkdir:
			assert.DirExists(t, sb.upperPath(d.path))
		case layers.OpUnlink:
			assert.True(t, isWhiteout(t, sb.upperPath(d.path)), "no whiteout for the deleted %s", d.path)
		}
	}

	// Clean the dead mount the way a user would.
	var out []byte
	if sb.useStandIn() {
		out, err = runTimeout(20*time.Second, "umount", "-l", sb.mnt)
	} else {
		out, err = runTimeout(20*time.Second, cliBin, "unmount", sb.mnt)
	}
	assert.NoError(t, err, "unmount the dead mount: %s", out)
	_, mounted := mountAt(sb.mnt)
	assert.False(t, mounted, "the dead mount is still there")
	assert.NoError(t, unix.Stat(sb.mnt, &st), "stat of the mountpoint after the cleanup")

	// The same upper mounts again and shows the changes.
	sb.start(t)
	for _, d := range ops {
		if d.op == layers.OpCreate {
			p := d.path
			if r, ok := renamed[p]; ok {
				p = r
			}
			if _, err := os.Stat(sb.path(p)); err != nil {
				t.Errorf("after the remount: %v", err)
				break
			}
		}
	}
}

// TestServerSigtermRightAfterMount: SIGTERM at the moment the mount shows
// up must still unmount and exit 0. (A server that catches SIGTERM only
// once fuse.Mount has returned dies with the mount left behind, or hangs
// in the kernel if the signal lands while go-fuse's own probe file in the
// mount is open.)
func TestServerSigtermRightAfterMount(t *testing.T) {
	for i := range 8 {
		orig := newOrig(t, map[string]string{"f": "f"})
		sb := mountSandbox(t, orig, mountedOnly())
		if err := sb.stop(); err != nil {
			t.Fatalf("try %d: SIGTERM as soon as the mount was in mountinfo: %v\nserver output:\n%s", i, err, sb.log.String())
		}
	}
}

// checkLayersStack runs check on a stack of orig over lower2 opened with
// layers.Open, without a mount.
func checkLayersStack(t *testing.T, orig, lower2 string, check func(*testing.T, func(string) ([]string, error), func(string) (string, error))) {
	dir := t.TempDir()
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	require.NoError(t, os.Mkdir(upper, 0o700))
	require.NoError(t, os.Mkdir(work, 0o700))
	l, err := layers.Open(layers.Config{Upper: upper, Work: work, Lowers: []string{orig, lower2}})
	require.NoError(t, err)
	defer l.Close()
	resolve := func(rel string) (layers.Entry, error) {
		e, err := l.Root()
		if err != nil || rel == "" {
			return e, err
		}
		dir := ""
		for _, name := range strings.Split(rel, "/") {
			if e, err = l.Lookup(dir, e.Obj, name); err != nil {
				return e, err
			}
			dir = layers.Join(dir, name)
		}
		return e, nil
	}
	ls := func(rel string) ([]string, error) {
		e, err := resolve(rel)
		if err != nil {
			return nil, err
		}
		ents, err := l.ReadDir(rel, e.Obj)
		var names []string
		for _, d := range ents {
			names = append(names, d.Name)
		}
		slices.Sort(names)
		return names, err
	}
	read := func(rel string) (string, error) {
		e, err := resolve(rel)
		if err != nil {
			return "", err
		}
		fd, _, err := l.Open(rel, &e.Obj, unix.O_RDONLY, layers.Caller{})
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		var b bytes.Buffer
		buf := make([]byte, 4096)
		for {
			n, err := unix.Read(fd, buf)
			if err != nil {
				return "", err
			}
			if n == 0 {
				return b.String(), nil
			}
			b.Write(buf[:n])
		}
	}
	check(t, ls, read)
}

// TestUnprivilegedUpperLayout: a server running as nobody (mounted through
// fusermount3) writes the overlay layout in the user.overlay.* namespace.
// The changes are made by nobody: without user_allow_other such a mount is
// reachable by its owner only.
func TestUnprivilegedUpperLayout(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"gone.txt": "gone", "tree/a": "a", "moved/x": "x", "moved/deep/y": "y", "data.txt": "data",
	})
	require.NoError(t, unix.Setxattr(filepath.Join(orig, "data.txt"), "user.tag", []byte("t"), 0))
	sb := mountSandbox(t, orig, asNobody())
	originalGuard(t, orig)
	script := `set -e
cd "$1"
rm gone.txt
rm -rf tree
mkdir tree
mv moved renamed
echo more >> data.txt
test "$(cat renamed/deep/y)" = y
`
	out, err := nobodyCmd(t, "sh", "-c", script, "sh", sb.mnt).CombinedOutput()
	require.NoError(t, err, "changes as nobody: %s", out)
	assert.Equal(t, "user.overlay.", sb.xattrPrefix())
	assert.True(t, isWhiteout(t, sb.upperPath("gone.txt")), "whiteout made by an unprivileged server")
	assert.Equal(t, "y", getxattr(t, sb.upperPath("tree"), "user.overlay.opaque"))
	assert.Equal(t, "/moved", getxattr(t, sb.upperPath("renamed"), "user.overlay.redirect"))
	assert.Equal(t, "t", getxattr(t, sb.upperPath("data.txt"), "user.tag"), "user.* attribute copied up")
	assert.Equal(t, "datamore\n", mustRead(t, sb.upperPath("data.txt")))
	for _, p := range []string{"tree", "renamed"} {
		_, err := fsutilGet(sb.upperPath(p), "trusted.overlay.opaque")
		assert.Error(t, err, "%s: a trusted.* attribute from an unprivileged server", p)
	}
}

func fsutilGet(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}
