package fsutil

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"
)

// A Linux path or attribute name is any bytes but NUL; encoding/json writes
// a string that is not valid UTF-8 with U+FFFD in place of each bad byte,
// and reads back a different name. sbxfs carries such strings through JSON
// in two ways:
//
//   - in its own files and sockets (the undo log, sandbox and manager
//     records, the daemon's requests) in its raw form ([EncodeRaw]):
//     itself when it is valid UTF-8, else NUL followed by its base64. No
//     path or name holds NUL, so the two never meet, and a file written
//     before this form reads the same. A type's MarshalJSON encodes the
//     fields of a copy of its value ([EncodeRawFields], [EncodeRawSlice],
//     [EncodeKeys]) and its UnmarshalJSON decodes them back;
//   - in what it prints (--json), as the string (U+FFFD where a byte is not
//     UTF-8, for display) with its exact bytes in a companion field
//     "<name>_b64" when it is not valid UTF-8: [B64IfInvalid], [FromB64].

// rawMark starts the encoded form of a string that is not valid UTF-8.
const rawMark = "\x00"

// EncodeRaw is the raw form of s: s itself when it is valid UTF-8
// and holds no NUL, else NUL and the base64 of s.
func EncodeRaw(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return rawMark + base64.StdEncoding.EncodeToString([]byte(s))
}

// DecodeRaw undoes EncodeRaw.
func DecodeRaw(s string) (string, error) {
	if len(s) == 0 || s[0] != rawMark[0] {
		return s, nil
	}
	b, err := base64.StdEncoding.DecodeString(s[1:])
	if err != nil {
		return "", fmt.Errorf("raw string %q: %w", s, err)
	}
	return string(b), nil
}

// EncodeKeys returns a copy of m with every key in the raw form, for a
// map keyed by paths or attribute names; nil stays nil.
func EncodeKeys[V any](m map[string]V) map[string]V {
	if m == nil {
		return nil
	}
	r := make(map[string]V, len(m))
	for k, v := range m {
		r[EncodeRaw(k)] = v
	}
	return r
}

// DecodeKeys undoes EncodeKeys.
func DecodeKeys[V any](m map[string]V) (map[string]V, error) {
	if m == nil {
		return nil, nil
	}
	r := make(map[string]V, len(m))
	for k, v := range m {
		d, err := DecodeRaw(k)
		if err != nil {
			return nil, err
		}
		r[d] = v
	}
	return r, nil
}

// B64IfInvalid is the companion field of s in printed JSON: its base64
// when s is not valid UTF-8, else "" (omitted).
func B64IfInvalid(s string) string {
	if utf8.ValidString(s) {
		return ""
	}
	return base64.StdEncoding.EncodeToString([]byte(s))
}

// FromB64 is the string a printed field and its companion name: the
// companion's bytes when there is one, else the field.
func FromB64(s, b64 string) (string, error) {
	if b64 == "" {
		return s, nil
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", fmt.Errorf("base64 of %q: %w", s, err)
	}
	return string(b), nil
}

// DecodeB64Fields sets each *fields[i] from its companion b64s[i] (FromB64).
func DecodeB64Fields(fields []*string, b64s []string) error {
	for i, f := range fields {
		s, err := FromB64(*f, b64s[i])
		if err != nil {
			return err
		}
		*f = s
	}
	return nil
}

// EncodeRawFields puts each *f in the raw form, for a MarshalJSON that
// marshals a copy of its value: the copy's string fields are encoded in
// place (its slices and maps, shared with the value, are replaced:
// EncodeRawSlice, EncodeKeys).
func EncodeRawFields(fs ...*string) {
	for _, f := range fs {
		*f = EncodeRaw(*f)
	}
}

// DecodeRawFields undoes EncodeRawFields after json.Unmarshal.
func DecodeRawFields(fs ...*string) error {
	for _, f := range fs {
		s, err := DecodeRaw(*f)
		if err != nil {
			return err
		}
		*f = s
	}
	return nil
}

// EncodeRawSlice returns a copy of ss in the raw form; nil stays nil.
func EncodeRawSlice(ss []string) []string {
	if ss == nil {
		return nil
	}
	r := make([]string, len(ss))
	for i, s := range ss {
		r[i] = EncodeRaw(s)
	}
	return r
}

// DecodeRawSlice undoes EncodeRawSlice in place.
func DecodeRawSlice(ss []string) error {
	for i := range ss {
		if err := DecodeRawFields(&ss[i]); err != nil {
			return err
		}
	}
	return nil
}
