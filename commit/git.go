package commit

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// GitCommit records committed paths in git without running git: blobs,
// trees and the commit are written with go-git's object packages, and the
// index and the ref with git's lock protocol (NAME.lock, fsync, rename),
// so a concurrent git command waits or fails instead of racing.
//
// Limits: content is stored as it is in the work tree (no clean filters
// such as Git LFS or autocrlf conversion); core.filemode=false is not
// honoured (the exec bit is read from the file); the index is rewritten
// without its optional extensions (cached trees, resolve-undo, untracked
// cache), which git rebuilds or does without; an index git wrote with a
// mandatory extension go-git does not know (split or sparse index) is
// refused. A commit is made even when the tree does not change.

// GitCommitOptions describe the commit GitCommit makes.
type GitCommitOptions struct {
	Message string // required
	// AuthorName and AuthorEmail default to the repository's user.name
	// and user.email (local, then global configuration), else to
	// "sbxfs <sbxfs@localhost>". The committer is the author.
	AuthorName  string
	AuthorEmail string
	When        time.Time // default: now
	// Moves are the directories renamed (GitMoves of the changes): the
	// files HEAD tracks beneath them move with them.
	Moves []GitMove
	// Replaced are the directories made anew, in place of whatever the
	// path held (GitReplaced of the changes): what HEAD tracks beneath
	// them goes (after Moves), and what they hold now is among the paths.
	// Without it, a directory the sandbox removed and made again kept in
	// the commit the files HEAD had there that it no longer has.
	Replaced []string
}

// Errors of GitCommit.
var (
	ErrNotGitWorkTree = errors.New("not inside a git work tree")
	ErrGitBare        = errors.New("the git repository is bare")
	ErrGitMessage     = errors.New("the commit message is empty")
	// ErrGitNothingToCommit says the paths hold in the work tree what
	// HEAD records already (a git commit made in the sandbox came with
	// them): no commit is made.
	ErrGitNothingToCommit = errors.New("nothing to commit: HEAD records the paths as they are")
)

// GitCommit records, in the git repository whose work tree is root (root
// or an ancestor holds .git), a commit whose tree is HEAD's tree with
// exactly paths (work-tree-relative to root, slash-separated) updated to
// their current state in the work tree: a regular file becomes a blob of
// mode 100644 or 100755, a symlink a 120000 blob of its target, a missing
// path (or one behind a symlink) is removed with everything beneath it,
// a directory only drops a file recorded at its path (its files are
// committed when they are listed themselves), and a FIFO, socket or
// device is left out (git holds none; git add -A passes over them): a
// path HEAD tracks keeps its entry, and git status shows it changed.
// Opt.Moves move HEAD's files beneath renamed directories first (see
// GitMove). HEAD's branch (or a
// detached HEAD) moves to the new commit and the listed paths' index
// entries are staged to the committed state; every other index entry and
// work tree file stays as it was. An unborn branch gets a root commit.
// It returns the new commit's hash.
func GitCommit(root string, paths []string, opt GitCommitOptions) (string, error) {
	if strings.TrimSpace(opt.Message) == "" {
		return "", ErrGitMessage
	}
	g, err := openGitWork(root)
	if err != nil {
		return "", err
	}
	rel, err := g.workPaths(paths)
	if err != nil {
		return "", err
	}
	replaced, err := g.workPaths(opt.Replaced)
	if err != nil {
		return "", err
	}
	moves, err := g.workMoves(opt.Moves)
	if err != nil {
		return "", err
	}
	h, err := g.commit(rel, replaced, moves, opt)
	if err != nil {
		return "", fmt.Errorf("git commit in %s: %w", g.top, err)
	}
	return h.String(), nil
}

// gitWork is an open repository with a work tree.
type gitWork struct {
	repo   *git.Repository
	dirs   gitDirs
	top    string // the work tree's top, symlinks resolved
	prefix string // root relative to top; "" for the top itself
}

func openGitWork(root string) (*gitWork, error) {
	abs, err := filepath.Abs(root)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("git commit: %w", err)
	}
	repo, err := git.PlainOpenWithOptions(abs, &git.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if errors.Is(err, git.ErrRepositoryNotExists) {
		if r, e := git.PlainOpen(abs); e == nil {
			if _, e := r.Worktree(); errors.Is(e, git.ErrIsBareRepository) {
				return nil, fmt.Errorf("%w: %s", ErrGitBare, abs)
			}
		}
		return nil, fmt.Errorf("%w: %s (no .git in it or above it)", ErrNotGitWorkTree, abs)
	}
	if err != nil {
		return nil, fmt.Errorf("open git repository at %s: %w", abs, err)
	}
	wt, err := repo.Worktree()
	if errors.Is(err, git.ErrIsBareRepository) {
		return nil, fmt.Errorf("%w: %s", ErrGitBare, abs)
	}
	if err != nil {
		return nil, err
	}
	if cfg, err := repo.Config(); err != nil || cfg.Core.IsBare {
		return nil, errors.Join(fmt.Errorf("%w: %s (core.bare)", ErrGitBare, abs), err)
	}
	st, ok := repo.Storer.(*filesystem.Storage)
	if !ok {
		return nil, fmt.Errorf("git repository at %s is not stored on disk", abs)
	}
	g := &gitWork{repo: repo}
	if g.dirs, err = findGitDirs(st.Filesystem().Root()); err != nil {
		return nil, err
	}
	if g.top, err = filepath.EvalSymlinks(wt.Filesystem.Root()); err != nil {
		return nil, err
	}
	prefix, err := filepath.Rel(g.top, abs)
	if err != nil || prefix == ".." || strings.HasPrefix(prefix, "../") || isGitDir(prefix) {
		return nil, fmt.Errorf("%w: %s is not in the work tree %s", ErrNotGitWorkTree, abs, g.top)
	}
	if prefix != "." {
		g.prefix = filepath.ToSlash(prefix)
	}
	return g, nil
}

// isGitDir reports whether the slash path p lies in a .git directory.
func isGitDir(p string) bool {
	return slices.ContainsFunc(strings.Split(filepath.ToSlash(p), "/"), func(c string) bool {
		return strings.EqualFold(c, ".git")
	})
}

// workPaths turns paths relative to root into sorted, distinct paths
// relative to the work tree's top.
func (g *gitWork) workPaths(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		c, err := fsutil.CleanRel(p)
		if err != nil {
			return nil, fmt.Errorf("git commit: %w", err)
		}
		full := path.Join(g.prefix, c)
		switch {
		case full == "":
			continue // the top itself: a directory, nothing to record
		case isGitDir(full):
			return nil, fmt.Errorf("git commit: path %q is in a .git directory: %w", p, fsutil.ErrPathEscapes)
		}
		out = append(out, full)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// head returns the reference a commit moves (HEAD's branch, or HEAD when
// detached) and the commit it points at (zero on an unborn branch).
func (g *gitWork) head() (plumbing.ReferenceName, plumbing.Hash, error) {
	ref, err := g.repo.Storer.Reference(plumbing.HEAD)
	if err != nil {
		return "", plumbing.ZeroHash, fmt.Errorf("read HEAD: %w", err)
	}
	if ref.Type() != plumbing.SymbolicReference {
		return plumbing.HEAD, ref.Hash(), nil
	}
	branch, err := g.repo.Storer.Reference(ref.Target())
	switch {
	case errors.Is(err, plumbing.ErrReferenceNotFound):
		return ref.Target(), plumbing.ZeroHash, nil
	case err != nil:
		return "", plumbing.ZeroHash, fmt.Errorf("read %s: %w", ref.Target(), err)
	case branch.Type() != plumbing.HashReference:
		return "", plumbing.ZeroHash, fmt.Errorf("%s is a symbolic reference to %s; check out a branch", ref.Target(), branch.Target())
	}
	return ref.Target(), branch.Hash(), nil
}

func (g *gitWork) commit(paths, replaced []string, moves gitMoves, opt GitCommitOptions) (plumbing.Hash, error) {
	lock, err := lockGitFile(filepath.Join(g.dirs.dir, "index"))
	if err != nil {
		return plumbing.ZeroHash, err
	}
	defer lock.release()
	idx, err := g.repo.Storer.Index()
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("read index: %w", err)
	}
	refName, parent, err := g.head()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	tree, parents := newGitTree(g.repo.Storer, plumbing.ZeroHash), []plumbing.Hash(nil)
	var headTree plumbing.Hash
	if !parent.IsZero() {
		pc, err := g.repo.CommitObject(parent)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("read HEAD commit: %w", err)
		}
		headTree = pc.TreeHash
		tree, parents = newGitTree(g.repo.Storer, pc.TreeHash), []plumbing.Hash{parent}
	}
	if err := tree.move(moves); err != nil {
		return plumbing.ZeroHash, err
	}
	edit, err := g.stage(tree, paths, replaced, moves)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	edit.moves = moves
	treeHash, err := tree.write()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if len(parents) == 1 && treeHash == headTree {
		return plumbing.ZeroHash, ErrGitNothingToCommit
	}
	c := g.newCommit(treeHash, parents, opt)
	obj := g.repo.Storer.NewEncodedObject()
	if err := c.Encode(obj); err != nil {
		return plumbing.ZeroHash, err
	}
	h, err := g.repo.Storer.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("write commit: %w", err)
	}
	edit.apply(idx)
	if err := writeIndex(lock, idx); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := g.dirs.syncObjects(); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := g.dirs.updateRef(g.repo.Storer, refName, parent, h); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := lock.commit(); err != nil {
		return h, fmt.Errorf("commit %s is made but the index was not updated (run git reset -- PATHS): %w", h, err)
	}
	who := c.Author.Name + " <" + c.Author.Email + ">"
	g.dirs.appendReflog(refName, parent, h, who, c.Author.When, c.Message)
	if refName != plumbing.HEAD {
		g.dirs.appendReflog(plumbing.HEAD, parent, h, who, c.Author.When, c.Message)
	}
	return h, nil
}

// newCommit is the commit object of tree; the message ends with a newline,
// as git writes it.
func (g *gitWork) newCommit(tree plumbing.Hash, parents []plumbing.Hash, opt GitCommitOptions) *object.Commit {
	sig := g.signature(opt)
	msg := opt.Message
	if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	return &object.Commit{Author: sig, Committer: sig, Message: msg, TreeHash: tree, ParentHashes: parents}
}

// stage brings each path's work tree state into tree and returns the
// matching index edit.
func (g *gitWork) stage(tree *gitTree, paths, replaced []string, moves gitMoves) (*gitIndexEdit, error) {
	top, err := unix.Open(g.top, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open work tree: %w", err)
	}
	defer unix.Close(top)
	edit := newGitIndexEdit()
	for _, p := range replaced {
		// What a move put there stays: a renamed directory's files are
		// not among the paths.
		removed, err := tree.removeExcept(p, moves.destinations())
		if err != nil {
			return nil, err
		}
		for _, r := range removed {
			edit.remove(r)
		}
	}
	for _, p := range paths {
		f, err := readWorkFile(g.repo.Storer, top, p)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", p, err)
		}
		switch {
		case f.special:
			// Git records no FIFO, socket or device: a file or symlink
			// HEAD has at p stays, as git add leaves it (git status
			// shows it modified), but a directory that was there is
			// gone with what it held, as git add -A takes it out.
			err = tree.removeDir(p)
			edit.removeBeneath(p)
		case !f.exists:
			err = tree.remove(p, false)
			edit.remove(p)
		case f.mode == filemode.Dir:
			err = tree.remove(p, true)
			edit.keepDir(p)
		default:
			err = tree.set(p, f.mode, f.blob)
			edit.set(p, &f)
		}
		if err != nil {
			return nil, err
		}
	}
	return edit, nil
}

// signature is the author (and committer) of the commit.
func (g *gitWork) signature(opt GitCommitOptions) object.Signature {
	sig := object.Signature{Name: opt.AuthorName, Email: opt.AuthorEmail, When: opt.When}
	cfg, err := g.repo.ConfigScoped(config.GlobalScope)
	if err != nil {
		cfg, _ = g.repo.Config()
	}
	if cfg != nil {
		sig.Name = firstNonEmpty(sig.Name, cfg.Author.Name, cfg.User.Name)
		sig.Email = firstNonEmpty(sig.Email, cfg.Author.Email, cfg.User.Email)
	}
	sig.Name = firstNonEmpty(sig.Name, "sbxfs")
	sig.Email = firstNonEmpty(sig.Email, "sbxfs@localhost")
	if sig.When.IsZero() {
		sig.When = time.Now()
	}
	return sig
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// CheckGitWorkTree says whether root lies in a git work tree GitCommit can
// commit in; callers check before changing anything.
func CheckGitWorkTree(root string) error {
	_, err := openGitWork(root)
	return err
}

// GitReplaced lists the directories the changes made anew
// (GitCommitOptions.Replaced), but those in a .git directory.
func GitReplaced(changes []layers.Change) []string {
	var out []string
	for _, c := range changes {
		if c.Kind == layers.Created && c.Type == "dir" && c.Path != "" && !isGitDir(c.Path) {
			out = append(out, c.Path)
		}
	}
	return out
}

// GitPaths lists the paths a git commit of the changes must record: every
// changed path and the source of every rename, but those in a .git
// directory: the repository's own files (an index git refreshed in the
// sandbox, the objects and refs of a git commit made there), which the
// commit put in place as files and git does not record.
func GitPaths(changes []layers.Change) []string {
	var out []string
	for _, c := range changes {
		if c.Path == "" {
			continue // the root's own metadata: git records none
		}
		if !isGitDir(c.Path) {
			out = append(out, c.Path)
		}
		if c.From != "" && c.Kind == layers.Renamed && !isGitDir(c.From) {
			out = append(out, c.From)
		}
	}
	return out
}
