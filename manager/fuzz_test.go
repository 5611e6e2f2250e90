package manager

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fuzzID = "0123456789abcdef"

// A record the decoder accepts is safe to act on: its id is its
// directory's, its paths are clean and absolute, its state is known.
func FuzzDecodeRecord(f *testing.F) {
	good, err := json.Marshal(record{Version: 1, ID: fuzzID, Plan: "p", Original: "/o", Mountpoint: "/m",
		State: Active, Created: time.Unix(1, 0)})
	require.NoError(f, err)
	f.Add(good)
	f.Add([]byte(`{"version":1,"id":"` + fuzzID + `","plan":"../x","original":"/o","mountpoint":"/m","state":"active","created":"2020-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"id":"` + fuzzID + `","plan":"p","original":"/o/../..","mountpoint":"/m","state":"active","created":"2020-01-01T00:00:00Z"}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b, fuzzID)
		if err != nil {
			assert.ErrorIs(t, err, ErrDamagedRecord)
			return
		}
		assert.Equal(t, fuzzID, r.ID)
		assert.NoError(t, checkPlan(r.Plan))
		assert.True(t, r.State.Valid())
		for _, p := range []string{r.Original, r.Mountpoint} {
			assert.True(t, filepath.IsAbs(p) && filepath.Clean(p) == p, p)
		}
	})
}

// A plan record the decoder accepts names its own plan, a known state and
// sandbox ids.
func FuzzDecodePlanRecord(f *testing.F) {
	f.Add([]byte(`{"version":1,"plan":"p","state":"committed","txns":[{"sandbox":"` + fuzzID + `","txn":"t"}]}`))
	f.Add([]byte(`{"version":1,"plan":"p","state":"prepared","txns":[{"sandbox":"../../x","txn":"t"}]}`))
	f.Add([]byte(`{"version":1,"plan":"q","state":"committed"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodePlanRecord(b, "p")
		if err != nil {
			assert.ErrorIs(t, err, ErrDamagedPlanRecord)
			return
		}
		assert.Equal(t, "p", p.Plan)
		assert.Contains(t, []string{planPrepared, planCommitted}, p.State)
		for _, x := range p.Txns {
			assert.True(t, validID(x.Sandbox))
		}
	})
}

// The hand-written name checks accept exactly what these patterns do.
func FuzzNameChecks(f *testing.F) {
	idPattern := regexp.MustCompile(`^[0-9a-f]{16}$`)
	planPattern := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)
	for _, s := range []string{fuzzID, "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", fuzzID + "\n",
		"p", "plan-1.x_y", ".p", "-p", "_p", "a/b", "..", "", "é", "a b", string(make([]byte, 100)),
		"a" + string(bytes100("b")), "a" + string(bytes100("b"))[1:]} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		assert.Equal(t, idPattern.MatchString(s), validID(s), "id %q", s)
		assert.Equal(t, planPattern.MatchString(s), validPlan(s), "plan %q", s)
	})
}

// bytes100 is s repeated 100 times.
func bytes100(s string) []byte {
	var b []byte
	for range 100 {
		b = append(b, s...)
	}
	return b
}
