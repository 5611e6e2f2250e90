package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// stateRoot returns the directory where sbxfs keeps the sandboxes it
// creates: flag (--state-dir) when set, else $SBXFS_STATE_DIR, else
// /var/lib/sbxfs for root, else $XDG_STATE_HOME/sbxfs or
// ~/.local/state/sbxfs.
func stateRoot(flag string) (string, error) {
	if flag != "" {
		return filepath.Abs(flag)
	}
	if d := os.Getenv("SBXFS_STATE_DIR"); d != "" {
		return filepath.Abs(d)
	}
	if os.Geteuid() == 0 {
		return "/var/lib/sbxfs", nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "sbxfs"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", failf(exitUsage, "cannot find a state directory: %v; set SBXFS_STATE_DIR or use --state-dir", err)
	}
	return filepath.Join(home, ".local", "state", "sbxfs"), nil
}

// newSandboxPath returns a fresh sandbox directory name under the state
// root: root/mounts/<16 hex digits>. Nothing is created.
func newSandboxPath(root string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random sandbox name: %w", err)
	}
	return filepath.Join(root, "mounts", hex.EncodeToString(b[:])), nil
}

// sandboxDirs are the two directories of a sandbox directory DIR.
func sandboxDirs(dir string) (upper, work string) {
	return filepath.Join(dir, "upper"), filepath.Join(dir, "work")
}

// makeSandbox creates the sandbox directory dir with its upper and work
// directories (all 0700) where they are missing, and keeps existing ones:
// a remount of the same dir shows the same changes.
func makeSandbox(dir string) error {
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return failf(exitBadPath, "sandbox directory %q is not a directory; give a directory for --upper", dir)
	}
	upper, work := sandboxDirs(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return failf(exitBadPath, "create %s: %v; %s", filepath.Dir(dir), err, mkdirHint(err))
	}
	for _, d := range []string{dir, upper, work} {
		if err := mkdir0700(d); err != nil {
			return err
		}
	}
	return nil
}

// mkdirHint says what to do about a sandbox directory that could not be
// made.
func mkdirHint(err error) string {
	switch {
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "check the permissions of its parent, or give another --upper"
	case errors.Is(err, unix.EROFS):
		return "its file system is read-only: give an --upper on a writable one"
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return "its file system is full: free space, or give another --upper"
	}
	return "give an --upper on a file system that holds ordinary directories"
}

// mkdir0700 creates d with mode 0700 whatever the umask; an existing
// directory is kept as it is. A symlink is refused: the sandbox would
// write wherever it points.
func mkdir0700(d string) error {
	err := os.Mkdir(d, 0o700)
	switch {
	case errors.Is(err, os.ErrExist):
		st, serr := os.Lstat(d)
		if serr == nil && st.Mode()&os.ModeSymlink != 0 {
			return failf(exitBadPath, "%q is a symlink; a sandbox's directories must be real directories: remove it or give another --upper", d)
		}
		if serr != nil || !st.IsDir() {
			return failf(exitBadPath, "%q exists and is not a directory; remove it or give another --upper", d)
		}
		return nil
	case err != nil:
		return failf(exitBadPath, "create %s: %v; %s", d, err, mkdirHint(err))
	}
	if err := os.Chmod(d, 0o700); err != nil {
		return fmt.Errorf("chmod %s: %w", d, err)
	}
	return nil
}
