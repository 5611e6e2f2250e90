package layers

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
