// Package fsutiltest makes real filesystems for tests: a small ext4 on a
// loop device, with the journal and mount options a test asks for.
package fsutiltest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MountExt4 makes a 64 MiB ext4 image with mkfs.ext4 options mkfsArgs
// (say "-O", "has_journal"), mounts it by loop device with the mount
// options opts and returns the mountpoint; it is unmounted (and the loop
// device freed) when the test ends. It skips the test when not root.
func MountExt4(t testing.TB, opts string, mkfsArgs ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a loop device")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(64 << 20)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{"-q", "-F"}, mkfsArgs...), img)
	if out, err := exec.Command("mkfs.ext4", args...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %v: %v: %s", args, err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop,"+opts, img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -o loop,%s: %v: %s", opts, err, out)
	}
	t.Cleanup(func() {
		// A test that failed midway may leave mounts beneath it (a
		// sandbox's mountpoint in a state root kept there), or a process
		// that is still exiting: detach the first, wait a little for the
		// second.
		detachBeneath(mnt)
		err := unix.Unmount(mnt, 0)
		for i := 0; errors.Is(err, unix.EBUSY) && i < 50; i++ {
			time.Sleep(100 * time.Millisecond)
			err = unix.Unmount(mnt, 0)
		}
		if err != nil {
			t.Errorf("unmount %s: %v (detached lazily)", mnt, err)
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt
}

// detachBeneath lazily detaches every mount strictly beneath dir, the
// deepest first.
func detachBeneath(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[4])
		if strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	for _, mp := range mps {
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
}

// ext4IocShutdown is EXT4_IOC_SHUTDOWN (_IOR('X', 125, __u32));
// ext4GoingNoLogFlush its flag that drops what the journal has not
// committed, as a power cut would.
const (
	ext4IocShutdown     = 0x8004587d
	ext4GoingNoLogFlush = 0x2
)

// PowerCutExt4 plays a power cut on an ext4 MountExt4 made: what its
// journal had not committed is lost (ShutdownExt4), and it is mounted
// again, with the options opts, as after a reboot (MountExt4Again).
// Mount it with "commit=60" so the journal does not commit on its own
// during the test.
func PowerCutExt4(t testing.TB, mnt, opts string) {
	t.Helper()
	ShutdownExt4(t, mnt)
	MountExt4Again(t, mnt, opts)
}

// ShutdownExt4 is the first half of a power cut: EXT4_IOC_SHUTDOWN with
// NOLOGFLUSH, which drops what the journal has not committed and fails
// every later access with EIO. Processes holding files there must let
// go before MountExt4Again.
func ShutdownExt4(t testing.TB, mnt string) {
	t.Helper()
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	flag := uint32(ext4GoingNoLogFlush)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), ext4IocShutdown, uintptr(unsafe.Pointer(&flag)))
	unix.Close(fd)
	if errno != 0 {
		t.Fatalf("EXT4_IOC_SHUTDOWN %s: %v", mnt, errno)
	}
}

// MountExt4Again unmounts the ext4 at mnt (made by MountExt4) and mounts
// its image there again with the options opts, as after a reboot.
func MountExt4Again(t testing.TB, mnt, opts string) {
	t.Helper()
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("unmount %s after the power cut: %v", mnt, err)
	}
	img := filepath.Join(filepath.Dir(mnt), "img")
	if out, err := exec.Command("mount", "-o", "loop,"+opts, img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -o loop,%s again after the power cut: %v: %s", opts, err, out)
	}
}

// Syncfs makes everything of the filesystem holding dir durable (what
// a test wants on disk before it plays a power cut).
func Syncfs(t testing.TB, dir string) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
}
