package manager

import (
	"encoding/json"
	"path/filepath"
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
