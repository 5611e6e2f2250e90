package fsutil

import (
	"errors"
	"fmt"
	"strings"
)

// ErrPathEscapes is returned (wrapped with the path) for a path that must be
// relative to a root but is not: absolute, with a ".." component, or with a
// NUL byte.
var ErrPathEscapes = errors.New("path escapes its root")

// CleanRel validates p as a path relative to some root and returns it in
// canonical form: no "." components, no duplicate or trailing slash. The
// empty string (and ".") means the root itself and gives "". An absolute
// path, any ".." component or a NUL byte is refused with ErrPathEscapes;
// ".." is refused rather than resolved because resolving it lexically is
// wrong when a component is a symlink.
func CleanRel(p string) (string, error) {
	switch {
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("path %q contains a NUL byte: %w", p, ErrPathEscapes)
	case strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("path %q is absolute: %w", p, ErrPathEscapes)
	}
	var b strings.Builder
	b.Grow(len(p))
	for rest := p; rest != ""; {
		var c string
		c, rest, _ = strings.Cut(rest, "/")
		switch c {
		case "", ".":
			continue
		case "..":
			return "", fmt.Errorf("path %q has a \"..\" component: %w", p, ErrPathEscapes)
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(c)
	}
	return b.String(), nil
}
