package fsutil

import (
	"os"
	"path/filepath"
	"testing"
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
