package fsutil

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCleanRel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    string
		escapes bool
	}{
		{in: "", want: ""},
		{in: ".", want: ""},
		{in: "./", want: ""},
		{in: "a", want: "a"},
		{in: "a/b/c", want: "a/b/c"},
		{in: "a//b///c/", want: "a/b/c"},
		{in: "./a/./b/.", want: "a/b"},
		{in: "a/.../b", want: "a/.../b"},
		{in: "..a/b..", want: "..a/b.."},
		{in: ".hidden", want: ".hidden"},
		{in: "new\nline", want: "new\nline"},
		{in: "\xff\xfe", want: "\xff\xfe"},
		{in: "/", escapes: true},
		{in: "/etc/passwd", escapes: true},
		{in: "//a", escapes: true},
		{in: "..", escapes: true},
		{in: "../a", escapes: true},
		{in: "a/..", escapes: true},
		{in: "a/../b", escapes: true},
		{in: "a/b/../../..", escapes: true},
		{in: "a/\x00b", escapes: true},
		{in: "\x00", escapes: true},
	}
	for _, tc := range tests {
		got, err := CleanRel(tc.in)
		if tc.escapes {
			assert.ErrorIs(t, err, ErrPathEscapes, "%q", tc.in)
			assert.Contains(t, err.Error(), fmt.Sprintf("%q", tc.in), "error names the path")
			continue
		}
		if assert.NoError(t, err, "%q", tc.in) {
			assert.Equal(t, tc.want, got, "%q", tc.in)
		}
	}
}

func FuzzCleanRel(f *testing.F) {
	for _, s := range []string{"", ".", "a/b", "a//b/", "../x", "/abs", "a/../..", "a\x00b", "./.././a", "...", "a/./b/."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		res, err := CleanRel(p)
		if err != nil {
			assert.ErrorIs(t, err, ErrPathEscapes)
			return
		}
		assert.False(t, filepath.IsAbs(res), "absolute result %q", res)
		assert.NotContains(t, res, "\x00")
		for _, c := range strings.Split(res, "/") {
			assert.NotEqual(t, "..", c, "%q -> %q", p, res)
			if res != "" {
				assert.NotContains(t, []string{"", "."}, c, "%q -> %q not canonical", p, res)
			}
		}
		joined := filepath.Join("/root", res)
		assert.True(t, joined == "/root" || strings.HasPrefix(joined, "/root/"), "%q escapes: %q", p, joined)
		again, err := CleanRel(res)
		if assert.NoError(t, err) {
			assert.Equal(t, res, again, "idempotent")
		}
	})
}
