package fsutil

import (
	"os"
	"path/filepath"
)

// EmptyDir removes every entry of dir, keeping dir itself. It follows no
// symlink: a symlink in dir is removed, not what it points to.
func EmptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
