package layers

import (
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// RandomHistorySettled is RandomHistory with a pause of settle between
// the writing of the original and the stack's opening, so that the
// original's objects are older than every upper object by more than a
// tick of the clock (the walk's bases after a power cut then match
// what the sandbox saw): for TestReconcileCutWhileAnotherWriterChanges.
func RandomHistorySettled(t *testing.T, cfg Config, seed int64, ops int, settle time.Duration) (*Layers, []string) {
	writeTree(t, cfg.Lowers[0], revLower)
	time.Sleep(settle)
	// revOp keeps its renames in a map of the package's (revMoves):
	// one history at a time.
	historyMu.Lock()
	defer historyMu.Unlock()
	l, err := Open(cfg)
	require.NoError(t, err)
	s := &stack{Layers: l, t: t, lower: cfg.Lowers[0], c: Caller{Pid: 1}}
	rng := rand.New(rand.NewSource(seed))
	var hist []string
	for i := 0; i < ops; i++ {
		if d := revOp(s, rng); d != "" {
			hist = append(hist, d)
		}
	}
	delete(revMoves, s)
	return l, hist
}

var historyMu sync.Mutex
