package layers

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Signature is what a commit compares to tell whether an original object
// changed after the sandbox first changed it. ctime moves with every change
// of content or metadata and cannot be set by a user, so it catches edits
// that keep size and mtime.
type Signature struct {
	Ino   uint64
	Mode  uint32
	Size  int64
	Mtime int64 // ns
	Ctime int64 // ns
}

// SignatureOf is the signature of a stat result.
func SignatureOf(st *unix.Stat_t) Signature {
	return Signature{Ino: st.Ino, Mode: st.Mode, Size: st.Size,
		Mtime: unix.TimespecToNsec(st.Mtim), Ctime: unix.TimespecToNsec(st.Ctim)}
}

func (s Signature) String() string {
	return fmt.Sprintf("v1 %d %d %d %d %d", s.Ino, s.Mode, s.Size, s.Mtime, s.Ctime)
}

// ParseSignature decodes Signature.String.
func ParseSignature(v string) (Signature, error) {
	f := strings.Fields(v)
	if len(f) != 6 || f[0] != "v1" {
		return Signature{}, fmt.Errorf("bad signature %q", v)
	}
	var n [5]int64
	for i := range n {
		x, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return Signature{}, fmt.Errorf("bad signature %q", v)
		}
		n[i] = x
	}
	return Signature{Ino: uint64(n[0]), Mode: uint32(n[1]), Size: n[2], Mtime: n[3], Ctime: n[4]}, nil
}

// noteBase records, once per mount, the signature of an object of the
// original (the top lower layer) that the sandbox is about to change.
func (l *Layers) noteBase(o Origin, st *unix.Stat_t) error {
	if o.Layer != 0 {
		return nil
	}
	if _, seen := l.bases.LoadOrStore(o.Path, true); seen {
		return nil
	}
	err := l.Journal().Append(Record{Op: OpBase, Path: o.Path, Path2: SignatureOf(st).String(), Time: now()})
	if err != nil {
		// Not recorded: the next change of it (the operation tried
		// again once the disk has room) records it. Kept as seen, a
		// removal retried went ahead without a base, which a commit
		// does not check (found by a review on 2026-11-28).
		l.bases.Delete(o.Path)
	}
	return err
}

// Bases returns the first recorded signature of every original path the
// journal records.
func Bases(recs []Record) map[string]Signature {
	out := map[string]Signature{}
	for _, r := range recs {
		if r.Op != OpBase {
			continue
		}
		if _, ok := out[r.Path]; ok {
			continue
		}
		if s, err := ParseSignature(r.Path2); err == nil {
			out[r.Path] = s
		}
	}
	return out
}
