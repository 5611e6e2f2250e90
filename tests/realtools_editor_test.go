package tests

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Editors save in one of three ways; rtSave* do what they do, step by
// step, with the syscalls they use.

// rtSaveAtomic is the "safe save" of VS Code (files.saveAtomically),
// gedit and most IDEs: the new content goes to a temporary file next to
// the original, which gets the original's mode, owner and user.*
// attributes and is fsynced; a backup copy file~ is made; the temporary
// file is renamed over the original name and the directory fsynced. The
// file gets a new inode.
func rtSaveAtomic(p string, content []byte) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".tmp-save")
	fd, err := unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = rtWriteAll(fd, content)
	if err == nil {
		err = unix.Fchmod(fd, st.Mode&0o7777)
	}
	if err == nil {
		err = unix.Fchown(fd, int(st.Uid), int(st.Gid))
	}
	if err == nil {
		var src int
		if src, err = unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			err = fsutil.CopyXattrs(fd, src, func(n string) bool { return !strings.HasPrefix(n, "user.") })
			unix.Close(src)
		}
	}
	if err == nil {
		err = unix.Fsync(fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = rtCopyFile(p, p+"~")
	}
	if err == nil {
		err = unix.Rename(tmp, p)
	}
	if err == nil {
		err = rtFsyncDir(filepath.Dir(p))
	}
	return err
}

// rtSaveRenameBackup is Emacs' default (and vim's backupcopy=no): the
// original is renamed to file~ and a new file is written under the name,
// with the original's mode; the backup keeps the original's inode.
func rtSaveRenameBackup(p string, content []byte) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	if err := unix.Rename(p, p+"~"); err != nil {
		return err
	}
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, st.Mode&0o777)
	if err != nil {
		return err
	}
	err = rtWriteAll(fd, content)
	if err == nil {
		err = unix.Fchmod(fd, st.Mode&0o7777)
	}
	if err == nil {
		err = unix.Fdatasync(fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}

// rtSaveInPlace is vim's backupcopy=yes and Emacs' backup-by-copying: a
// copy of the file is kept as file~, then the file is truncated and
// rewritten in place (same inode, so hard links and owners stay).
func rtSaveInPlace(p string, content []byte) error {
	if err := rtCopyFile(p, p+"~"); err != nil {
		return err
	}
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = rtWriteAll(fd, content)
	if err == nil {
		err = unix.Fsync(fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}

func rtWriteAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// rtCopyFile copies src to dst as cp -p does (content, mode, times),
// replacing dst.
func rtCopyFile(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		return err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	fd, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = rtWriteAll(fd, b)
	if err == nil {
		err = unix.Fchmod(fd, st.Mode&0o7777)
	}
	if err == nil {
		err = unix.Futimes(fd, []unix.Timeval{unix.NsecToTimeval(st.Atim.Nano()), unix.NsecToTimeval(st.Mtim.Nano())})
	}
	if err == nil {
		err = unix.Fsync(fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}

func rtFsyncDir(d string) error {
	fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = unix.Fsync(fd)
	unix.Close(fd)
	return err
}

// rtInodeFacts tells how a save treated the file's identity: whether the
// name (symlinks followed) still has the inode it had, whether file~
// has it now, and the link counts. The same save on ext4 and in the mount
// must tell the same.
func rtInodeFacts(p string, before uint64) string {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "stat: " + errnoName(errnoOf(err))
	}
	real, _ := filepath.EvalSymlinks(p)
	facts := fmt.Sprintf("same inode %v, mode %#o, nlink %d", st.Ino == before, st.Mode&0o7777, st.Nlink)
	var bst unix.Stat_t
	if err := unix.Lstat(real+"~", &bst); err == nil {
		facts += fmt.Sprintf("; backup: has the old inode %v, mode %#o, nlink %d", bst.Ino == before, bst.Mode&0o7777, bst.Nlink)
	} else {
		facts += "; backup: " + errnoName(errnoOf(err))
	}
	return facts
}

func rtIno(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatalf("stat %s: %v", p, err)
	}
	return st.Ino
}

// rtEditorOriginal is the original the editor tests edit: files with
// several modes, an attribute, a symlink to a file, and files the work
// hard-links in the sandbox (a hard link in the original is broken by a
// copy-up: a documented departure, so the original has none).
func rtEditorOriginal(t *testing.T) string {
	orig := newOrig(t, map[string]string{
		"plain.txt":      "a plain file, a line, another line\n",
		"secret.txt":     "a secret, attributes and all\n",
		"script.sh":      "#!/bin/sh\necho a script\n",
		"readonly.txt":   "a read-only file\n",
		"target.txt":     "a file behind a symlink\n",
		"sym.txt":        "->target.txt",
		"linked.txt":     "a file that gets a second name\n",
		"dir/nested.txt": "a nested file, in a directory\n",
	})
	for name, mode := range map[string]os.FileMode{"secret.txt": 0o600, "script.sh": 0o755, "readonly.txt": 0o444} {
		if err := os.Chmod(filepath.Join(orig, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setxattr(filepath.Join(orig, "secret.txt"), "user.tag", []byte("keep me"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(orig, "plain.txt"), 1234, 2345); err != nil {
		t.Fatal(err)
	}
	return orig
}

// rtEditorPrepare does, on one side, what happens before the edits: a
// second name for linked.txt and a file created in the sandbox.
func rtEditorPrepare(t *testing.T, root string) {
	if err := os.Link(filepath.Join(root, "linked.txt"), filepath.Join(root, "linked-too.txt")); err != nil {
		t.Fatal(err)
	}
	rtWrite(t, filepath.Join(root, "created.txt"), "a file made in the sandbox, a line\n", 0o640)
}

// TestRealEditorSafeSave saves every file of an original three times
// over, once in each way editors save (atomic rename with a backup copy,
// rename to a backup, copy backup and rewrite in place), in the mount and
// in a plain copy. After each save the file's inode identity, mode and
// link counts and its backup's must behave as on the plain copy; the
// trees (content, modes, owners, user.* attributes, symlinks, link
// counts) must be the same; after sbxfs commit the original must be too.
func TestRealEditorSafeSave(t *testing.T) {
	rtNeedCLI(t)
	orig := rtEditorOriginal(t)
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig)
	saves := []struct {
		name string
		save func(string, []byte) error
	}{{"atomic", rtSaveAtomic}, {"rename-backup", rtSaveRenameBackup}, {"in-place", rtSaveInPlace}}
	files := []string{"plain.txt", "secret.txt", "script.sh", "readonly.txt", "sym.txt", "linked.txt", "created.txt", "dir/nested.txt"}

	work := func(root string) []string {
		rtEditorPrepare(t, root)
		var facts []string
		for _, f := range files {
			for i, s := range saves {
				p := filepath.Join(root, f)
				real, err := filepath.EvalSymlinks(p) // editors save through symlinks
				if err != nil {
					t.Fatal(err)
				}
				before := rtIno(t, real)
				content := []byte(fmt.Sprintf("%s: saved %d times, the last one %s\n", f, i+1, s.name))
				if err := s.save(real, content); err != nil {
					t.Fatalf("save %s %s: %v", s.name, p, err)
				}
				if got := mustRead(t, p); got != string(content) {
					t.Errorf("%s after the %s save: %q, want %q", p, s.name, got, content)
				}
				facts = append(facts, fmt.Sprintf("%s, %s save: %s", f, s.name, rtInodeFacts(p, before)))
			}
		}
		return facts
	}
	want := work(ref)
	got := work(sb.mnt)
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Errorf("inode semantics differ:\n  plain: %s\n  mount: %s", want[i], got[min(i, len(got)-1)])
		}
	}
	o := walkOpts{xattr: userXattrs, owner: true}
	rtCompareTrees(t, "the mount vs the plain copy after the saves", ref, sb.mnt, o, nil)
	rtCommit(t, sb, "editor saves")
	rtCompareTrees(t, "the original after the commit vs the plain copy", ref, orig, o, nil)
}

// TestRealVim edits files with vim in Ex mode (vim -Es, with its swap
// file and its fsync), with each way vim keeps a backup while writing
// (backupcopy yes, no and auto, with backup and writebackup), over
// original files, a file made in the sandbox, a file with two names, a
// symlink and a read-only file (:wq!). The same edits are made in a plain
// copy; the inode identity of each file and its backup, and the trees,
// must be the same, and after sbxfs commit the original must be too.
func TestRealVim(t *testing.T) {
	rtNeedCLI(t)
	names := []string{"vim", "vim.basic", "vim.tiny"}
	if v := os.Getenv("SBXFS_TEST_VIM"); v != "" {
		names = []string{v} // e.g. vim.tiny, the one scripts/install-deps.sh installs
	}
	vim := rtNeedTool(t, names...)
	t.Logf("vim: %s", vim)
	orig := rtEditorOriginal(t)
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig)
	home := t.TempDir()
	modes := []string{
		"backupcopy=yes writebackup backup",
		"backupcopy=no writebackup backup",
		"backupcopy=auto writebackup backup",
		"backupcopy=no writebackup nobackup",
		"backupcopy=auto nowritebackup nobackup",
	}
	files := []string{"plain.txt", "secret.txt", "script.sh", "readonly.txt", "sym.txt", "linked.txt", "created.txt", "dir/nested.txt"}

	work := func(side, root string) []string {
		rtEditorPrepare(t, root)
		s := newRtShell(t, side, root, rtBaseEnv("HOME="+home, "TERM=dumb"))
		var facts []string
		for _, f := range files {
			for i, m := range modes {
				p := filepath.Join(root, f)
				before := rtIno(t, p)
				// Every run replaces the current "a" (or the "b" the
				// previous run made) so each write changes the file.
				from, to := "a", "b"
				if i%2 == 1 {
					from, to = "b", "a"
				}
				s.run(filepath.Dir(p), vim, "-Es", "-N", "-u", "NONE", "-i", "NONE",
					"--cmd", "set "+m+" fsync backupskip=", "-c", "%s/"+from+"/"+to+"/g", "-c", "wq!", filepath.Base(p))
				facts = append(facts, fmt.Sprintf("%s, %s: %s", f, m, rtInodeFacts(p, before)))
				// vim leaves no swap file behind.
				if _, err := os.Lstat(filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".swp")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("[%s] %s: swap file left (%v)", side, f, err)
				}
			}
		}
		return facts
	}
	want := work("plain", ref)
	got := work("mount", sb.mnt)
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Errorf("vim treated a file differently:\n  plain: %s\n  mount: %s", want[i], got[min(i, len(got)-1)])
		}
	}
	if s := mustRead(t, sb.path("plain.txt")); strings.Contains(s, "a") {
		t.Errorf("vim did not edit plain.txt: %q", s)
	}
	o := walkOpts{xattr: userXattrs, owner: true}
	rtCompareTrees(t, "the mount vs the plain copy after the vim edits", ref, sb.mnt, o, nil)
	rtCommit(t, sb, "vim edits")
	rtCompareTrees(t, "the original after the commit vs the plain copy", ref, orig, o, nil)
}
