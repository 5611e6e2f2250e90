package layers

import (
	"encoding/json"

	"github.com/sbxfs/sbxfs/fsutil"
)

// changeB64 holds the exact bytes of a Change's paths that are not valid
// UTF-8, beside the fields that show them (fsutil.B64IfInvalid): the form
// of every change list sbxfs prints, and of those the daemon sends.
type changeB64 struct {
	PathB64     string `json:"path_b64,omitempty"`
	FromB64     string `json:"from_b64,omitempty"`
	OriginalB64 string `json:"original_b64,omitempty"`
	ReplacedB64 string `json:"replaced_b64,omitempty"`
}

// MarshalJSON writes c with a path_b64 (from_b64, original_b64,
// replaced_b64) beside each path that is not valid UTF-8.
func (c Change) MarshalJSON() ([]byte, error) {
	type plain Change
	return json.Marshal(struct {
		plain
		changeB64
	}{plain(c), changeB64{
		PathB64: fsutil.B64IfInvalid(c.Path), FromB64: fsutil.B64IfInvalid(c.From),
		OriginalB64: fsutil.B64IfInvalid(c.Original), ReplacedB64: fsutil.B64IfInvalid(c.Replaced),
	}})
}

// UnmarshalJSON reads what MarshalJSON writes, the exact bytes included.
func (c *Change) UnmarshalJSON(b []byte) error {
	type plain Change
	v := struct {
		*plain
		changeB64
	}{plain: (*plain)(c)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return fsutil.DecodeB64Fields([]*string{&c.Path, &c.From, &c.Original, &c.Replaced},
		[]string{v.PathB64, v.FromB64, v.OriginalB64, v.ReplacedB64})
}
