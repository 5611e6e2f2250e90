package manager

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sbxfs/sbxfs/fsutil"
)

// recordVersion is the version of the sandbox record this code writes.
const recordVersion = 1

// recordName is the record's name in the sandbox directory.
const recordName = "record.json"

// IsManagedDir reports whether dir is the directory of a managed sandbox
// (it holds a sandbox record), which only its daemon may change.
func IsManagedDir(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, recordName))
	return err == nil
}

// ErrDamagedRecord marks a sandbox record this code cannot trust.
var ErrDamagedRecord = errors.New("damaged sandbox record")

// record is the registry's entry for one sandbox, stored as
// StateRoot/sandboxes/<id>/record.json (see docs/manager.md).
type record struct {
	Version    int       `json:"version"`
	ID         string    `json:"id"`
	Plan       string    `json:"plan"`
	Name       string    `json:"name,omitempty"`
	Original   string    `json:"original"`
	Mountpoint string    `json:"mountpoint"`
	OwnMount   bool      `json:"own_mountpoint,omitempty"` // the manager made the mountpoint directory
	State      State     `json:"state"`
	Created    time.Time `json:"created"`
	Updated    time.Time `json:"updated"`
	Error      string    `json:"error,omitempty"` // why it is errored, or what its last operation left behind
	// Ended is the transaction of the plan commit after which the
	// sandbox was last ended (reset and kept, or made Committed): the
	// next operation on the plan, settling that commit, never ends it
	// again (a kept one may hold new work by then).
	Ended string `json:"ended,omitempty"`
}

// MarshalJSON writes the record's paths byte for byte (fsutil.EncodeRaw):
// an original whose path is not UTF-8 is found again.
func (r record) MarshalJSON() ([]byte, error) {
	type plain record
	p := plain(r)
	fsutil.EncodeRawFields(&p.Original, &p.Mountpoint)
	return json.Marshal(p)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *record) UnmarshalJSON(b []byte) error {
	type plain record
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	return fsutil.DecodeRawFields(&r.Original, &r.Mountpoint)
}

// validID reports whether s has the form of a sandbox id: 16 lower-case
// hexadecimal digits. (By hand: every sbxfs command pays for a package's
// compiled regular expressions at start.)
func validID(s string) bool {
	if len(s) != 16 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// validPlan reports whether plan is 1 to 100 letters, digits, '.', '_'
// or '-', starting with a letter or digit.
func validPlan(plan string) bool {
	if len(plan) < 1 || len(plan) > 100 {
		return false
	}
	for i := 0; i < len(plan); i++ {
		c := plan[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// checkPlan refuses a plan name that is not a safe file name.
func checkPlan(plan string) error {
	if !validPlan(plan) {
		return fmt.Errorf("%w: plan name %q: use 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalid, plan)
	}
	return nil
}

// validate checks a record read from dir (named by the sandbox id).
func (r *record) validate(id string) error {
	switch {
	case r.Version < 1 || r.Version > recordVersion:
		return fmt.Errorf("version %d (this sbxfs reads up to %d)", r.Version, recordVersion)
	case r.ID != id:
		return fmt.Errorf("id %q in the directory of %q", r.ID, id)
	case !validID(r.ID):
		return fmt.Errorf("bad id %q", r.ID)
	case checkPlan(r.Plan) != nil:
		return fmt.Errorf("bad plan %q", r.Plan)
	case !filepath.IsAbs(r.Original) || filepath.Clean(r.Original) != r.Original:
		return fmt.Errorf("original %q is not a clean absolute path", r.Original)
	case !filepath.IsAbs(r.Mountpoint) || filepath.Clean(r.Mountpoint) != r.Mountpoint:
		return fmt.Errorf("mountpoint %q is not a clean absolute path", r.Mountpoint)
	case !r.State.Valid():
		return fmt.Errorf("unknown state %q", r.State)
	case r.Created.IsZero():
		return errors.New("no creation time")
	}
	return nil
}

// decodeRecord parses and validates the record of sandbox id.
func decodeRecord(b []byte, id string) (*record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrDamagedRecord, id, err)
	}
	if err := r.validate(id); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrDamagedRecord, id, err)
	}
	return &r, nil
}

// readRecord reads the record of the sandbox directory dir.
func readRecord(dir string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(dir, recordName))
	if err != nil {
		return nil, err
	}
	return decodeRecord(b, filepath.Base(dir))
}

// writeRecord stores r in the sandbox directory dir, atomically.
func writeRecord(dir string, r *record) error {
	r.Version = recordVersion
	r.Updated = time.Now().UTC()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, recordName), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("sandbox %s: write record: %w", r.ID, err)
	}
	return nil
}

// scan is what the state root's sandboxes directory holds.
type scan struct {
	records []*record
	damaged map[string]error // sandbox directory name -> why its record is refused
	orphans []string         // sandbox directory names without a record
}

// scanSandboxes reads every record under dir (StateRoot/sandboxes). A
// damaged record is reported in damaged, never fatal.
func scanSandboxes(dir string) (scan, error) {
	s := scan{damaged: map[string]error{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return s, err
	}
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() {
			continue
		}
		r, err := readRecord(filepath.Join(dir, name))
		switch {
		case errors.Is(err, os.ErrNotExist):
			s.orphans = append(s.orphans, name)
		case err != nil:
			s.damaged[name] = err
		default:
			s.records = append(s.records, r)
		}
	}
	return s, nil
}
