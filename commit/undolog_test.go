package commit

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func validLog() []byte {
	b, _ := json.Marshal(undoLog{Version: undoLogVersion, ID: "x", State: statePrepared, Original: "/o", Txn: "/w/txn-x",
		Steps: []step{{Kind: opDetach, Path: "a/b", Slot: "b/1"}, {Kind: opMeta, Path: "a", New: &meta{Mode: 0o755}}}})
	return b
}

func TestDecodeUndoLogRejectsDamage(t *testing.T) {
	_, err := decodeUndoLog(validLog())
	require.NoError(t, err)
	bad := map[string]string{
		"escaping path":   `"path":"a/b"` + "|" + `"path":"../etc/passwd"`,
		"absolute path":   `"path":"a/b"` + "|" + `"path":"/etc/passwd"`,
		"escaping slot":   `"slot":"b/1"` + "|" + `"slot":"../../x"`,
		"unknown kind":    `"kind":"detach"` + "|" + `"kind":"rm"`,
		"newer version":   `"version":1` + "|" + `"version":2`,
		"unknown state":   `"state":"prepared"` + "|" + `"state":"half"`,
		"relative origin": `"original":"/o"` + "|" + `"original":"o"`,
	}
	for name, sub := range bad {
		parts := strings.SplitN(sub, "|", 2)
		data := strings.Replace(string(validLog()), parts[0], parts[1], 1)
		require.NotEqual(t, string(validLog()), data, name)
		_, err := decodeUndoLog([]byte(data))
		assert.ErrorIs(t, err, ErrUndoLog, name)
	}
}

func FuzzDecodeUndoLog(f *testing.F) {
	f.Add(validLog())
	f.Add([]byte(`{}`))
	f.Add(validLog()[:40])
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := decodeUndoLog(data)
		if err != nil {
			return
		}
		for _, s := range l.Steps {
			for _, p := range []string{s.Path, s.Slot} {
				j := filepath.Join("/root", p)
				if !strings.HasPrefix(j, "/root/") && j != "/root" {
					t.Fatalf("step path %q escapes its root", p)
				}
			}
		}
	})
}
