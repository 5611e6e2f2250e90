package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// Paths that are not UTF-8 (Linux allows any bytes but NUL and '/') go
// through every JSON sbxfs writes byte for byte. Before, JSON wrote U+FFFD
// for each bad byte: a sandbox of such an original could not be mounted
// ("upper belongs to another original"), the daemon looked for another
// original, and a managed commit --git of such names made no git commit
// and said nothing.
func TestNamesThatAreNotUTF8(t *testing.T) {
	t.Parallel()
	const origName, file, moved, added = "caf\xe9", "f\xff", "g\xfe", "n\xfc"

	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		bin := sbxfsBin(t)
		base := realTempDir(t)
		orig, mnt, dir := filepath.Join(base, origName), filepath.Join(base, "mnt\xfa"), filepath.Join(base, "sandbox")
		require.NoError(t, os.Mkdir(orig, 0o755))
		writeFile(t, filepath.Join(orig, file), "f\n")
		require.NoError(t, os.Mkdir(mnt, 0o755))
		cleanupMount(t, mnt)
		r := runBin(t, bin, "mount", "--upper", dir, orig, mnt)
		require.Equal(t, 0, r.code, r.stderr)
		writeFile(t, filepath.Join(mnt, file), "changed\n")
		writeFile(t, filepath.Join(mnt, added), "n\n")

		st := statusOf(t, mnt)
		exact := func(s, b64 string) string {
			v, err := fsutil.FromB64(s, b64)
			require.NoError(t, err)
			return v
		}
		assert.Equal(t, orig, exact(st.Original, st.OriginalB64), "original_b64 holds the exact path")
		assert.Equal(t, mnt, exact(st.Mountpoint, st.MountpointB64))
		require.Len(t, st.Changes, 2)
		assert.Equal(t, added, exact(st.Changes[1].Path, st.Changes[1].PathB64))
		r = runBin(t, bin, "commit", "--json", mnt)
		require.Equal(t, 0, r.code, r.stderr)
		var rec struct {
			Changes []layers.Change `json:"changes"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &rec), r.stdout)
		assert.Equal(t, []layers.Change{{Path: file, Kind: layers.Modified, Type: "file"}, {Path: added, Kind: layers.Created, Type: "file"}}, rec.Changes)
		assertFile(t, filepath.Join(orig, file), "changed\n")
		assertFile(t, filepath.Join(orig, added), "n\n")
	})

	t.Run("managed, with git", func(t *testing.T) {
		t.Parallel()
		e := newManagedEnv(t)
		orig := e.original(origName)
		writeFile(t, filepath.Join(orig, file), "f\n")
		git := gitRepo(t, orig)
		git("config", "core.quotePath", "true")

		sb := e.create(orig)
		assert.Equal(t, orig, sb.Original, "create --json names the original exactly (original_b64)")
		require.NoError(t, os.Rename(filepath.Join(sb.Mountpoint, file), filepath.Join(sb.Mountpoint, moved)))
		writeFile(t, filepath.Join(sb.Mountpoint, added), "n\n")
		r := e.sbxfs("commit", "--git", "-m", "names", sb.ID)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, "committed "+sb.ID+" (git commit "+git("rev-parse", "HEAD")+")\n", r.stdout)
		assert.Equal(t, "R100\t\"f\\377\"\t\"g\\376\"\nA\t\"n\\374\"", git("show", "--name-status", "--format=", "HEAD"))
		assert.Empty(t, git("status", "--porcelain"))
		assertFile(t, filepath.Join(orig, moved), "f\n")
	})
}
