package layers

import (
	"os"
	"testing"
)

// TestMain has every change set of the package's tests classified on
// four goroutines, a path each at least (classifyAll), so that the race
// detector sees them share the replay; the CLI's and the mount's tests
// keep the defaults, under which a small change set is classified on one.
func TestMain(m *testing.M) {
	classifyWorkers, classifyPerWorker = 4, 1
	os.Exit(m.Run())
}
