// Package fsutiltest makes real filesystems for tests: a small ext4 on a
// loop device, with the journal and mount options a test asks for.
package fsutiltest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

// ext4IocShutdown is EXT4_IOC_SHUTDOWN (_IOR('X', 125, __u32));
// ext4GoingNoLogFlush its flag that drops what the journal has not
// committed, as a power cut would.
const (
	ext4IocShutdown     = 0x8004587d
	ext4GoingNoLogFlush = 0x2
)

// PowerCutExt4 plays a power cut on an ext4 MountExt4 made: what its
// journal had not committed is lost (EXT4_IOC_SHUTDOWN with
// NOLOGFLUSH), and it is mounted again, with the options opts, as after
// a reboot. Mount it with "commit=60" so the journal does not commit on
// its own during the test.
func PowerCutExt4(t testing.TB, mnt, opts string) {
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
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("unmount %s after the power cut: %v", mnt, err)
	}
	img := filepath.Join(filepath.Dir(mnt), "img")
	if out, err := exec.Command("mount", "-o", "loop,"+opts, img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -o loop,%s again after the power cut: %v: %s", opts, err, out)
	}
}
