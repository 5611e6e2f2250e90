package tests

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil/fsutiltest"
)

// Tests of the server's /dev/fuse loop (fuse/devloop.go): one reader
// answers requests in place, a watchdog adds readers when a request takes
// long, and buffers that large requests touched are given back.

// TestStalledUpperHoldsUpNothingElse: a request that waits long must not
// hold up the mount's other requests. The upper layer is on a filesystem
// that is frozen (fsfreeze, as a disk that stops answering would): a
// mkdir in directory a through the mount waits at it. Meanwhile a stat, a
// listing, a lookup of a name not seen yet and reads of original files
// outside a (the kernel keeps a locked for the mkdir, as on ext4) all
// answer at once; the mkdir completes once the filesystem thaws.
func TestStalledUpperHoldsUpNothingElse(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "fsfreeze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install e2fsprogs and util-linux (scripts/install-deps.sh)", tool)
		}
	}
	scratch := fsutiltest.MountExt4(t, "rw")
	orig := newOrig(t, map[string]string{"a/b": "hello", "c": "see", "d/e": "deep"})
	sb := mountSandbox(t, orig, withNoIOUring(), withStateIn(scratch))
	_, err := os.Stat(sb.path("c"))
	require.NoError(t, err)

	freeze(t, scratch)
	made := make(chan error, 1)
	go func() { made <- os.Mkdir(sb.path("a", "new"), 0o755) }()
	select {
	case err := <-made:
		t.Fatalf("mkdir into a frozen upper returned at once: %v", err)
	case <-time.After(300 * time.Millisecond): // the server is in the mkdir now
	}

	// The other requests, each with a deadline: on the old loop without
	// a watchdog they would wait for the thaw.
	answered := make(chan string, 1)
	start := time.Now()
	go func() {
		var got []string
		if _, err := os.Stat(sb.path("c")); err != nil {
			got = append(got, "stat: "+err.Error())
		}
		if es, err := os.ReadDir(sb.mnt); err == nil {
			got = append(got, strconv.Itoa(len(es))+" names")
		}
		if b, err := os.ReadFile(sb.path("d", "e")); err == nil {
			got = append(got, string(b))
		}
		if b, err := os.ReadFile(sb.path("c")); err == nil {
			got = append(got, string(b))
		}
		answered <- strings.Join(got, ", ")
	}()
	select {
	case got := <-answered:
		t.Logf("answered in %v while the mkdir waited", time.Since(start))
		assert.Equal(t, "3 names, deep, see", got)
	case <-time.After(5 * time.Second):
		thaw(t, scratch)
		t.Fatalf("other requests waited for the stalled mkdir (still waiting after 5 s)")
	}
	select {
	case err := <-made:
		t.Fatalf("mkdir into a frozen upper returned before the thaw: %v", err)
	default:
	}

	thaw(t, scratch)
	select {
	case err := <-made:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("mkdir still waiting 10 s after the thaw")
	}
	st, err := os.Stat(sb.upperPath("a", "new"))
	require.NoError(t, err, "the mkdir landed in the upper")
	assert.True(t, st.IsDir())
	require.NoError(t, sb.stop())
}

// TestParallelLookupsGetHelpers: lookups made from several threads at once
// (git status lstats the index's files from up to 20) queue up behind the
// one being answered; the reader starts helper readers for them instead
// of answering one after the other, and every answer is right.
func TestParallelLookupsGetHelpers(t *testing.T) {
	const dirs, files = 16, 64
	tree := map[string]string{}
	for d := range dirs {
		for f := range files {
			tree[fmt.Sprintf("d%d/f%d", d, f)] = strings.Repeat("x", d*files+f)
		}
	}
	orig := newOrig(t, tree)
	sb := mountSandbox(t, orig, withNoIOUring())
	var wg sync.WaitGroup
	wrong := make(chan string, dirs*files)
	for d := range dirs {
		wg.Go(func() {
			for f := range files {
				st, err := os.Lstat(sb.path(fmt.Sprintf("d%d", d), fmt.Sprintf("f%d", f)))
				if err != nil || st.Size() != int64(d*files+f) {
					wrong <- fmt.Sprintf("d%d/f%d: %v %v", d, f, err, st)
				}
			}
		})
	}
	wg.Wait()
	close(wrong)
	for w := range wrong {
		t.Error(w)
	}
	require.NoError(t, sb.stop())
	m := regexp.MustCompile(`lookup_helpers=(\d+)`).FindStringSubmatch(sb.log.String())
	require.NotNil(t, m, "the server's last words name its helpers:\n%s", sb.log.String())
	helpers, _ := strconv.Atoi(m[1])
	t.Logf("%d helper readers for %d lookups from %d threads", helpers, dirs*files, dirs)
	assert.Positive(t, helpers, "no helper reader was started for the queued lookups")
}

// TestDevLoopGivesBackBuffers: large requests are answered on goroutines,
// each with a copy in a buffer of its own; once the mount is quiet, the
// server gives the pages of the buffers it keeps back. Large WRITEs
// without passthrough make such buffers (large READs of original files
// are spliced and leave theirs clean). Eight writers at once: the server
// keeps up to four buffers, each holding a 1 MiB WRITE (how many depends
// on how many WRITEs it answered at once), and must give them back: its
// anonymous memory drops by at least one buffer's worth, and its last
// log line counts the buffers it trimmed.
func TestDevLoopGivesBackBuffers(t *testing.T) {
	const files, mib = 8, 16
	orig := newOrig(t, nil)
	sb := mountSandbox(t, orig, withNoIOUring(), withNoPassthrough())
	require.Contains(t, sb.log.String(), "transport=/dev/fuse")
	cmd, _ := sb.running()
	require.NotNil(t, cmd)
	pid := cmd.Process.Pid
	before := rssAnonKB(t, pid)

	var wg sync.WaitGroup
	errs := make([]error, files)
	for i := range files {
		wg.Go(func() {
			f, err := os.Create(sb.path("big" + strconv.Itoa(i)))
			if err != nil {
				errs[i] = err
				return
			}
			chunk := bytes.Repeat([]byte{byte(i + 1)}, 1<<20)
			for range mib {
				if _, err = f.Write(chunk); err != nil {
					break
				}
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			errs[i] = err
		})
	}
	wg.Wait()
	peak := rssAnonKB(t, pid)
	for i, err := range errs {
		require.NoError(t, err)
		b, err := os.ReadFile(sb.upperPath("big" + strconv.Itoa(i)))
		require.NoError(t, err)
		require.Len(t, b, mib<<20)
		require.Equal(t, byte(i+1), b[len(b)-1])
	}

	// The kept buffers hold ~1 MiB each until the watchdog trims them
	// (after 50 quiet ticks); threads the writes made and the Go heap
	// stay, so what is checked is the drop from the peak, not the level.
	var last int64
	assert.Eventually(t, func() bool {
		last = rssAnonKB(t, pid)
		return peak-last >= 900
	}, 10*time.Second, 100*time.Millisecond, "the buffers of large WRITEs are given back once the mount is quiet")
	t.Logf("server RssAnon: %d KiB before the writes, %d KiB right after, %d KiB once quiet", before, peak, last)
	require.NoError(t, sb.stop())
	m := regexp.MustCompile(`buffers_trimmed=(\d+)`).FindStringSubmatch(sb.log.String())
	require.NotNil(t, m, "the server's last words count the buffers trimmed:\n%s", sb.log.String())
	trimmed, _ := strconv.Atoi(m[1])
	assert.Positive(t, trimmed, "no buffer was trimmed")
}

func freeze(t *testing.T, mnt string) {
	t.Helper()
	out, err := exec.Command("fsfreeze", "-f", mnt).CombinedOutput()
	require.NoError(t, err, "fsfreeze -f: %s", out)
	t.Cleanup(func() { _ = exec.Command("fsfreeze", "-u", mnt).Run() })
}

func thaw(t *testing.T, mnt string) {
	t.Helper()
	out, err := exec.Command("fsfreeze", "-u", mnt).CombinedOutput()
	require.NoError(t, err, "fsfreeze -u: %s", out)
}
