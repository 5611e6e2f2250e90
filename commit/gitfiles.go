package commit

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// The files of a git directory are written under git's lock protocol:
// create NAME.lock with O_EXCL (a git process that finds it waits or
// fails), write and fsync it, rename it over NAME, fsync the directory.

// ErrGitLocked is returned when a git lock file is held, by a running git
// command or one that crashed.
var ErrGitLocked = errors.New("git lock file exists")

// gitLock is a held NAME.lock.
type gitLock struct {
	path string // NAME
	f    *os.File
}

func lockGitFile(path string) (*gitLock, error) {
	f, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("%w: %s.lock; another git process is running, or remove it if none is", ErrGitLocked, path)
	}
	if err != nil {
		return nil, err
	}
	return &gitLock{path: path, f: f}, nil
}

// commit makes the written lock file NAME.
func (l *gitLock) commit() error {
	if err := l.f.Sync(); err != nil {
		return err
	}
	if err := l.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(l.path+".lock", l.path); err != nil {
		return err
	}
	l.f = nil
	return fsutil.SyncDir(filepath.Dir(l.path))
}

// release drops the lock without touching NAME (a no-op once committed).
func (l *gitLock) release() {
	if l.f != nil {
		l.f.Close()
		os.Remove(l.path + ".lock")
		l.f = nil
	}
}

// gitIndexEdit is the set of index changes of a commit, applied in one
// pass over the entries.
type gitIndexEdit struct {
	drop      map[string]bool // entries at these names go, every stage
	dropFile  map[string]bool // a non-submodule entry at these names goes
	dropUnder map[string]bool // entries beneath these directories go
	// a submodule entry at these names goes
	dropSubmodule map[string]bool
	add           []*index.Entry
	moves         gitMoves // renamed directories: their entries move first
}

func newGitIndexEdit() *gitIndexEdit {
	return &gitIndexEdit{drop: map[string]bool{}, dropFile: map[string]bool{}, dropUnder: map[string]bool{}, dropSubmodule: map[string]bool{}}
}

// set stages p as f. An entry beneath p, or a file entry at one of p's
// parents, cannot stay beside it.
func (e *gitIndexEdit) set(p string, f *gitWorkFile) {
	e.drop[p], e.dropUnder[p] = true, true
	for q := p; strings.Contains(q, "/"); {
		q = q[:strings.LastIndexByte(q, '/')]
		e.drop[q] = true
	}
	st := &f.st
	e.add = append(e.add, &index.Entry{
		Hash: f.blob, Name: p, Mode: f.mode,
		CreatedAt:  time.Unix(st.Ctim.Sec, st.Ctim.Nsec),
		ModifiedAt: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Dev:        uint32(st.Dev), Inode: uint32(st.Ino), UID: st.Uid, GID: st.Gid,
		Size: uint32(st.Size),
	})
}

// remove unstages p and everything beneath it.
func (e *gitIndexEdit) remove(p string) { e.drop[p], e.dropUnder[p] = true, true }

// removeBeneath unstages everything beneath p and a submodule at p; a
// file entry at p stays.
func (e *gitIndexEdit) removeBeneath(p string) { e.dropUnder[p], e.dropSubmodule[p] = true, true }

// keepDir drops a file entry at p, which is a directory now.
func (e *gitIndexEdit) keepDir(p string) { e.dropFile[p] = true }

func (e *gitIndexEdit) apply(idx *index.Index) {
	kept := idx.Entries[:0]
	for _, en := range idx.Entries {
		to, moved, gone := e.moves.translate(en.Name)
		if gone {
			continue
		}
		if moved {
			en.Name = to
		}
		if !e.drops(en) {
			kept = append(kept, en)
		}
	}
	idx.Entries = append(kept, e.add...)
	// The cached trees describe the old entries; git rebuilds them.
	idx.Cache = nil
}

func (e *gitIndexEdit) drops(en *index.Entry) bool {
	if e.drop[en.Name] || e.dropFile[en.Name] && en.Mode != filemode.Submodule || e.dropSubmodule[en.Name] && en.Mode == filemode.Submodule {
		return true
	}
	for q := en.Name; strings.Contains(q, "/"); {
		q = q[:strings.LastIndexByte(q, '/')]
		if e.dropUnder[q] {
			return true
		}
	}
	return false
}

// writeIndex encodes idx into the held index lock.
func writeIndex(l *gitLock, idx *index.Index) error {
	bw := bufio.NewWriter(l.f)
	if err := index.NewEncoder(bw).Encode(idx); err != nil {
		return fmt.Errorf("encode index: %w", err)
	}
	return bw.Flush()
}

// gitDirs are the directories of one repository: dir holds HEAD and the
// index of this work tree, common the objects and the refs (they differ
// for a linked work tree, `git worktree add`).
type gitDirs struct {
	dir, common string
}

func findGitDirs(dir string) (gitDirs, error) {
	d := gitDirs{dir: dir, common: dir}
	b, err := os.ReadFile(filepath.Join(dir, "commondir"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return d, nil
	case err != nil:
		return d, err
	}
	c := strings.TrimSpace(string(b))
	if !filepath.IsAbs(c) {
		c = filepath.Join(dir, c)
	}
	d.common = filepath.Clean(c)
	return d, nil
}

// refPath is the file of a loose reference.
func (d gitDirs) refPath(name plumbing.ReferenceName) string {
	if name == plumbing.HEAD {
		return filepath.Join(d.dir, "HEAD")
	}
	return filepath.Join(d.common, filepath.FromSlash(name.String()))
}

// updateRef points name at h if it still points at old (zero: does not
// exist yet), under git's lock protocol.
func (d gitDirs) updateRef(s storer.ReferenceStorer, name plumbing.ReferenceName, old, h plumbing.Hash) error {
	p := d.refPath(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	l, err := lockGitFile(p)
	if err != nil {
		return err
	}
	defer l.release()
	cur, err := s.Reference(name)
	switch {
	case errors.Is(err, plumbing.ErrReferenceNotFound):
		cur = plumbing.NewHashReference(name, plumbing.ZeroHash)
	case err != nil:
		return err
	}
	if cur.Type() != plumbing.HashReference || cur.Hash() != old {
		return fmt.Errorf("%s moved while committing (now %s, was %s); retry", name, cur.Hash(), old)
	}
	if _, err := l.f.WriteString(h.String() + "\n"); err != nil {
		return err
	}
	return l.commit()
}

// appendReflog records the update in the reflog of name, as git does. It
// is best effort: the commit is made already.
func (d gitDirs) appendReflog(name plumbing.ReferenceName, old, h plumbing.Hash, who string, when time.Time, msg string) {
	p := filepath.Join(d.common, "logs", filepath.FromSlash(name.String()))
	if name == plumbing.HEAD {
		p = filepath.Join(d.dir, "logs", "HEAD")
	}
	if os.MkdirAll(filepath.Dir(p), 0o755) != nil {
		return
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	subject, _, _ := strings.Cut(strings.TrimSpace(msg), "\n")
	kind := "commit"
	if old.IsZero() {
		kind = "commit (initial)"
	}
	fmt.Fprintf(f, "%s %s %s %d %s\t%s: %s\n", old, h, who, when.Unix(), when.Format("-0700"), kind, subject)
}

// syncObjects makes the written objects durable before a ref names them.
func (d gitDirs) syncObjects() error {
	fd, err := unix.Open(filepath.Join(d.common, "objects"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", d.common, err)
	}
	return nil
}
