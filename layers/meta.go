package layers

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// MetaVersion is the version of the sandbox record this code writes.
const MetaVersion = 1

// MetaFile is the name of the sandbox record in the work directory.
const MetaFile = "sandbox.json"

// Meta is the record a sandbox keeps next to its journal: which layers it
// joins. It binds an upper to its original, so an upper is never mounted
// over another original by mistake.
type Meta struct {
	Version int       `json:"version"`
	Lowers  []string  `json:"lowers"` // top first; Lowers[0] is the original
	Upper   string    `json:"upper"`
	Created time.Time `json:"created"`
	// XattrNS is the namespace of the upper's overlay attributes:
	// "trusted" or "user". An upper keeps it for life.
	XattrNS string `json:"xattr_ns"`
}

// MarshalJSON writes the layers' paths byte for byte (fsutil.EncodeRaw):
// a sandbox of a directory whose path is not UTF-8 is bound to it.
func (m Meta) MarshalJSON() ([]byte, error) {
	type plain Meta
	p := plain(m)
	p.Lowers = fsutil.EncodeRawSlice(m.Lowers)
	fsutil.EncodeRawFields(&p.Upper)
	return json.Marshal(p)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (m *Meta) UnmarshalJSON(b []byte) error {
	type plain Meta
	if err := json.Unmarshal(b, (*plain)(m)); err != nil {
		return err
	}
	if err := fsutil.DecodeRawSlice(m.Lowers); err != nil {
		return err
	}
	return fsutil.DecodeRawFields(&m.Upper)
}

// Config returns the layers configuration the record describes.
func (m *Meta) Config(work string) Config {
	return Config{Upper: m.Upper, Work: work, Lowers: m.Lowers, UserXattrs: m.XattrNS == "user"}
}

// Errors of the sandbox record.
var (
	ErrMetaVersion  = errors.New("sandbox record was written by a newer sbxfs")
	ErrMetaMismatch = errors.New("upper belongs to another original")
)

// ReadMeta reads the sandbox record of the work directory work.
func ReadMeta(work string) (*Meta, error) {
	b, err := os.ReadFile(filepath.Join(work, MetaFile))
	if err != nil {
		return nil, err
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("sandbox record %s: %w", filepath.Join(work, MetaFile), err)
	}
	if m.Version > MetaVersion || m.Version < 1 {
		return nil, fmt.Errorf("%w: %s has version %d", ErrMetaVersion, filepath.Join(work, MetaFile), m.Version)
	}
	if len(m.Lowers) == 0 || m.Upper == "" {
		return nil, fmt.Errorf("sandbox record %s: no layers recorded", filepath.Join(work, MetaFile))
	}
	return &m, nil
}

// WriteMeta writes the sandbox record atomically (mode 0600).
func WriteMeta(work string, m *Meta) error {
	m.Version = MetaVersion
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(work, MetaFile), append(b, '\n'), 0o600)
}

// Bind makes sure the work directory of cfg records exactly cfg's layers:
// it writes the record of a new sandbox, and refuses an existing one that
// was made for other layers. cfg takes the recorded attribute namespace.
func Bind(cfg *Config) error {
	m, err := ReadMeta(cfg.Work)
	switch {
	case errors.Is(err, os.ErrNotExist):
		ns := "trusted"
		if cfg.userXattrs() {
			ns = "user"
		}
		return WriteMeta(cfg.Work, &Meta{Lowers: cfg.Lowers, Upper: cfg.Upper, Created: now(), XattrNS: ns})
	case err != nil:
		return err
	}
	cfg.UserXattrs = m.XattrNS == "user"
	if !sameStrings(m.Lowers, cfg.Lowers) || m.Upper != cfg.Upper {
		return fmt.Errorf("%w: %s was made for lower layers %q and upper %q, not %q and %q; use another upper directory",
			ErrMetaMismatch, cfg.Work, m.Lowers, m.Upper, cfg.Lowers, cfg.Upper)
	}
	return nil
}

// ErrStillThere refuses to rebind a sandbox to a new place of its
// original while the recorded place still holds a directory.
var ErrStillThere = errors.New("the recorded original is still there")

// Rebind records cfg's lower layers for a sandbox whose recorded layers
// were moved: every recorded layer that cfg names otherwise must be gone
// from its recorded place (else ErrStillThere: that is another original,
// not a moved one). The upper and the number of layers must match. The
// changes keep their bases: a commit checks each path it changes against
// the original at its new place (moved with mv(1), they match; a copy
// conflicts on every path the sandbox changed). A sandbox with nothing to
// rebind is left as it is.
func Rebind(cfg *Config) error {
	m, err := ReadMeta(cfg.Work)
	if err != nil {
		return err
	}
	if m.Upper != cfg.Upper || len(m.Lowers) != len(cfg.Lowers) {
		return fmt.Errorf("%w: %s was made for lower layers %q and upper %q, not %q and %q; a moved original keeps its upper and its number of layers",
			ErrMetaMismatch, cfg.Work, m.Lowers, m.Upper, cfg.Lowers, cfg.Upper)
	}
	for i, l := range m.Lowers {
		if l == cfg.Lowers[i] {
			continue
		}
		if _, err := os.Lstat(l); !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
			return fmt.Errorf("%w: %s (the sandbox's layer %d) was not moved to %s", ErrStillThere, l, i+1, cfg.Lowers[i])
		}
	}
	if sameStrings(m.Lowers, cfg.Lowers) {
		return nil
	}
	m.Lowers = slices.Clone(cfg.Lowers)
	return WriteMeta(cfg.Work, m)
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
