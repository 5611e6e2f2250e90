package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/manager"
)

// Through io_uring, a daemon's mounts share one ring thread a CPU
// (fuse/uring_pool.go): eight sandboxes, six made at once, two nested (the child's
// server reads the parent's mount, whose requests from that CPU the same
// thread serves), leave the daemon with as many ring threads as the
// machine has CPUs, and every mount answers. Runs where the kernel's
// enable_uring switch is on (scripts/test's second pass).
func TestDaemonSharesRingThreads(t *testing.T) {
	t.Parallel()
	if b, err := os.ReadFile("/sys/module/fuse/parameters/enable_uring"); err != nil || strings.TrimSpace(string(b)) != "Y" {
		t.Skip("FUSE over io_uring is off: scripts/test runs this with it on")
	}
	e := newManagedEnv(t, withRaceBin)
	n := e.nested()
	n.assertAllNew(t, n.b.Mountpoint)
	// Six more made at once: their queues register on the shared
	// threads while the others serve.
	others := make([]manager.SandboxInfo, 6)
	origs := make([]string, len(others))
	for i := range origs {
		origs[i] = e.original("x" + strconv.Itoa(i))
	}
	var wg sync.WaitGroup
	for i := range others {
		wg.Go(func() {
			r := e.sbxfs("create", "--json", origs[i])
			if assert.Equal(t, 0, r.code, r.stderr) {
				assert.NoError(t, json.Unmarshal([]byte(r.stdout), &others[i]), r.stdout)
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	for _, sb := range append(others, n.a, n.b) {
		assert.Equal(t, "io_uring", e.transport(sb.ID), sb.ID)
	}
	for _, sb := range others {
		writeFile(t, filepath.Join(sb.Mountpoint, "new"), sb.ID)
		assertFile(t, filepath.Join(sb.Mountpoint, "new"), sb.ID)
		assertFile(t, filepath.Join(sb.Mountpoint, "a.txt"), "hello\n")
	}
	n.assertAllNew(t, n.b.Mountpoint)

	rings := map[string]int{}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/comm", e.daemonPid()))
	require.NoError(t, err)
	for _, f := range tasks {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), "sbxfs-ring") {
			rings[strings.TrimSpace(string(b))]++
		}
	}
	cpus := possibleCPUs(t)
	assert.Len(t, rings, cpus, "one ring thread a CPU: %v", rings)
	for name, k := range rings {
		assert.Equal(t, 1, k, "threads named %s", name)
	}
}

// possibleCPUs counts the kernel's possible CPUs (one FUSE queue each).
func possibleCPUs(t *testing.T) int {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	require.NoError(t, err)
	last := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		_, hi, _ := strings.Cut(part, "-")
		n, err := strconv.Atoi(cmp.Or(hi, part))
		require.NoError(t, err)
		last = max(last, n)
	}
	return last + 1
}

// A sandbox whose original stops answering (a FUSE filesystem that stalls
// every lookup of a name, as a network filesystem whose server is gone
// would) holds up only its own requests: another sandbox of the same
// daemon answers from every CPU meanwhile, also through io_uring, where
// the daemon's mounts share one ring thread a CPU (the stalled sandbox's
// requests are answered off it: fuse/uring_serve.go, offThread).
func TestDaemonStalledOriginal(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t, withRaceBin)
	stalled := stallingOriginal(t, e.base)
	a := e.create(stalled.mnt)
	b := e.create(e.original("b"))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cpus := runtime.NumCPU()
	var waiting []*exec.Cmd
	for c := range cpus {
		cmd := exec.CommandContext(ctx, "taskset", "-c", strconv.Itoa(c), "stat", filepath.Join(a.Mountpoint, "stall1"))
		require.NoError(t, cmd.Start())
		waiting = append(waiting, cmd)
	}
	time.Sleep(300 * time.Millisecond)
	for c := range cpus {
		// A request the server has taken cannot be killed: on a timeout
		// the stall ends first, so that the test fails instead of hanging.
		p := filepath.Join(b.Mountpoint, "new"+strconv.Itoa(c))
		cmd := exec.Command("taskset", "-c", strconv.Itoa(c), "sh", "-c", `cat "$1"/a.txt && echo x > "$2" && cat "$2"`, "sh", b.Mountpoint, p)
		type result struct {
			out []byte
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := cmd.CombinedOutput()
			done <- result{out, err}
		}()
		select {
		case r := <-done:
			require.NoError(t, r.err, "sandbox %s from CPU %d while %s stalls: %s", b.ID, c, a.ID, r.out)
			assert.Equal(t, "hello\nx\n", string(r.out))
		case <-time.After(10 * time.Second):
			stalled.release()
			<-done
			t.Fatalf("sandbox %s did not answer from CPU %d within 10 s while the original of %s stalled", b.ID, c, a.ID)
		}
	}
	for _, cmd := range waiting {
		assert.Nil(t, cmd.ProcessState, "the stat in the stalled sandbox is still waiting")
	}

	stalled.release()
	for _, cmd := range waiting {
		assert.NoError(t, cmd.Wait(), "the stat in the stalled sandbox ends once its original answers")
	}
}

// stalling is a FUSE filesystem (tests/internal/faultyfs) over a
// directory holding a.txt and stall1, whose lookups of stall1 wait until
// release.
type stalling struct {
	mnt     string
	release func()
}

func stallingOriginal(t *testing.T, base string) stalling {
	t.Helper()
	dir, mnt := filepath.Join(base, "stalldir"), filepath.Join(base, "stallmnt")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.MkdirAll(mnt, 0o755))
	writeFile(t, filepath.Join(dir, "a.txt"), "hello\n")
	writeFile(t, filepath.Join(dir, "stall1"), "s\n")
	bin := filepath.Join(base, "faultyfs")
	out, err := exec.Command(goBin(), "build", "-o", bin, "../../tests/internal/faultyfs").CombinedOutput()
	require.NoError(t, err, "go build faultyfs: %s", out)
	cmd := exec.Command(bin, dir, mnt)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- strings.TrimSpace(line) == "ready"
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "faultyfs did not start")
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("faultyfs did not start in time")
	}
	release := func() { _ = cmd.Process.Signal(syscall.SIGUSR1) }
	t.Cleanup(func() {
		release()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			_ = exec.Command("umount", "-l", mnt).Run()
		}
	})
	return stalling{mnt: mnt, release: release}
}
