package fsutil

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestEmptyDir(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	kept := filepath.Join(outside, "kept")
	if err := os.WriteFile(kept, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "a/b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a/b/f"), []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := EmptyDir(dir); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != 0 {
		t.Fatalf("after EmptyDir: %v entries, %v; want none", len(ents), err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("EmptyDir followed a symlink out of the directory: %v", err)
	}
	if err := EmptyDir(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("EmptyDir of a missing directory: %v, want not exist", err)
	}
}

func TestRemoveContentsAt(t *testing.T) {
	base, outside := t.TempDir(), t.TempDir()
	dir := filepath.Join(base, "dir")
	for _, d := range []string{"dir/a/b", "dir/c"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"dir/f", "dir/a/g", "dir/a/b/h", filepath.Join(outside, "kept")} {
		if !filepath.IsAbs(f) {
			f = filepath.Join(base, f)
		}
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "a", "link")); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// Moved, with a symlink to elsewhere in its place: the descriptor's
	// directory is emptied, not the symlink's.
	moved := filepath.Join(base, "moved")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, dir); err != nil {
		t.Fatal(err)
	}
	if err := RemoveContentsAt(fd); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(moved); err != nil || len(ents) != 0 {
		t.Errorf("the moved directory holds %v (%v), want nothing", ents, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "kept")); err != nil {
		t.Errorf("a file outside is gone: %v", err)
	}
}
