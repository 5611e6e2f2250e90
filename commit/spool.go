package commit

import (
	"bytes"
	"io"
	"os"
)

// spool holds what is written to it until it is copied out: in memory up
// to spoolMem bytes, then in an unlinked temporary file. The patch writes
// its rest there while the deletions it must put first go out directly.
type spool struct {
	mem bytes.Buffer
	f   *os.File
}

const spoolMem = 16 << 20

func (s *spool) Write(p []byte) (int, error) {
	if s.f == nil && s.mem.Len()+len(p) <= spoolMem {
		return s.mem.Write(p)
	}
	if s.f == nil {
		f, err := os.CreateTemp("", "sbxfs-diff-")
		if err != nil {
			return 0, err
		}
		os.Remove(f.Name()) // nothing else needs its name
		s.f = f
		if _, err := s.mem.WriteTo(f); err != nil {
			return 0, err
		}
	}
	return s.f.Write(p)
}

// copyTo writes everything held to w.
func (s *spool) copyTo(w io.Writer) error {
	if s.f == nil {
		_, err := s.mem.WriteTo(w)
		return err
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err := io.Copy(w, s.f)
	return err
}

func (s *spool) close() {
	if s.f != nil {
		s.f.Close()
	}
}
