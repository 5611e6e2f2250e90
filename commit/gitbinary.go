package commit

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"hash"
	"strings"
)

// Git's binary patch (git diff --binary), which git apply applies: a full
// index line (git apply checks the blob ids of both sides), then the new
// content and the old, each deflated with zlib and written in git's base
// 85, 52 bytes a line.

// writeBinaryPatch writes the binary patch of a pair whose sides were
// read whole (pairOpts.fullBinary).
func writeBinaryPatch(b *bytes.Buffer, old, new *diffSide) {
	fmt.Fprintf(b, "index %s..%s\nGIT binary patch\n", blobID(old), blobID(new))
	writeLiteral(b, sideData(new))
	writeLiteral(b, sideData(old))
}

func sideData(s *diffSide) []byte {
	if !s.exists {
		return nil
	}
	return s.data
}

// blobID is git's object id of a side's content (all zeros for none).
func blobID(s *diffSide) string {
	switch {
	case !s.exists:
		return strings.Repeat("0", 2*sha1.Size)
	case s.hasBlob:
		return hex.EncodeToString(s.blob[:])
	}
	h := newBlobHash(int64(len(s.data)))
	h.Write(s.data)
	return hex.EncodeToString(h.Sum(nil))
}

// newBlobHash starts git's object id of a blob of size bytes: write the
// content, then Sum.
func newBlobHash(size int64) hash.Hash {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", size)
	return h
}

// abbrevBlobID is blobID shortened as git shows it in the index line of
// a patch without --binary.
func abbrevBlobID(s *diffSide) string { return blobID(s)[:7] }

// writeLiteral writes one "literal" hunk: data whole, deflated.
func writeLiteral(b *bytes.Buffer, data []byte) {
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(data) // a bytes.Buffer does not fail
	zw.Close()
	fmt.Fprintf(b, "literal %d\n", len(data))
	for enc := z.Bytes(); len(enc) > 0; {
		n := min(52, len(enc))
		if n <= 26 {
			b.WriteByte(byte('A' + n - 1))
		} else {
			b.WriteByte(byte('a' + n - 27))
		}
		encode85(b, enc[:n])
		b.WriteByte('\n')
		enc = enc[n:]
	}
	b.WriteByte('\n')
}

const git85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

// encode85 writes data in git's base 85: five characters for each four
// bytes (big-endian), a last short group padded with zero bytes.
func encode85(b *bytes.Buffer, data []byte) {
	for len(data) > 0 {
		var acc uint32
		for i := range 4 {
			acc <<= 8
			if i < len(data) {
				acc |= uint32(data[i])
			}
		}
		var out [5]byte
		for i := 4; i >= 0; i-- {
			out[i] = git85[acc%85]
			acc /= 85
		}
		b.Write(out[:])
		data = data[min(4, len(data)):]
	}
}
