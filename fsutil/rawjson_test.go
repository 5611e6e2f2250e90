package fsutil

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawRec is a record as sbxfs's own files keep one: a path, a list of
// paths and a map keyed by names, in the raw form.
type rawRec struct {
	P string         `json:"p"`
	L []string       `json:"l"`
	M map[string]int `json:"m"`
}

func (r rawRec) MarshalJSON() ([]byte, error) {
	type plain rawRec
	p := plain(r)
	EncodeRawFields(&p.P)
	p.L, p.M = EncodeRawSlice(r.L), EncodeKeys(r.M)
	return json.Marshal(p)
}

func (r *rawRec) UnmarshalJSON(b []byte) error {
	type plain rawRec
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	m, err := DecodeKeys(r.M)
	r.M = m
	if err != nil {
		return err
	}
	if err := DecodeRawSlice(r.L); err != nil {
		return err
	}
	return DecodeRawFields(&r.P)
}

// Every byte string a path or attribute name can be comes back from JSON
// as it went in, and the value marshalled is left as it was; a valid UTF-8
// one is written as plain JSON, as before the raw form.
func TestRawFormRoundTrips(t *testing.T) {
	names := []string{"", "plain", "dir/caf\xe9", "\xff\xfe", "ünïcode/ok", "tab\tand\nnewline", "\x00", "a\x00b", "\xed\xa0\x80"}
	for _, n := range names {
		in := rawRec{P: n, L: []string{n, "x"}, M: map[string]int{n: 1}}
		b, err := json.Marshal(in)
		require.NoError(t, err)
		assert.Equal(t, rawRec{P: n, L: []string{n, "x"}, M: map[string]int{n: 1}}, in, "marshalling changes nothing")
		var out rawRec
		require.NoError(t, json.Unmarshal(b, &out), "%s", b)
		assert.Equal(t, in, out, "%s", b)
	}

	b, err := json.Marshal(rawRec{P: "caf\u00e9/f", L: []string{"a"}})
	require.NoError(t, err)
	assert.Equal(t, `{"p":"café/f","l":["a"],"m":null}`, string(b), "valid UTF-8 is written as itself")
	b, err = json.Marshal(rawRec{P: "caf\xe9"})
	require.NoError(t, err)
	assert.Equal(t, `{"p":"\u0000Y2Fm6Q==","l":null,"m":null}`, string(b))

	var bad rawRec
	assert.Error(t, json.Unmarshal([]byte(`{"p":"\u0000not base64!"}`), &bad), "a damaged form is an error, not a wrong name")
}

func TestRawCompanionB64(t *testing.T) {
	assert.Equal(t, "", B64IfInvalid("café"))
	assert.Equal(t, "Y2Fm6Q==", B64IfInvalid("caf\xe9"))
	s, err := FromB64("caf\ufffd", "Y2Fm6Q==")
	require.NoError(t, err)
	assert.Equal(t, "caf\xe9", s)
	s, err = FromB64("café", "")
	require.NoError(t, err)
	assert.Equal(t, "café", s)
	_, err = FromB64("x", "!!")
	assert.Error(t, err)
}
