package fuse

import (
	"runtime"
	"sync"
	"time"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// names keeps the sandbox's directory names still while an operation
// turns a node into an upper path (from the names go-fuse keeps for its
// nodes) and uses that path. Without it, a path made before a rename of
// a directory and used after another operation put a symlink at the
// directory's old name led through that symlink, out of the upper: a
// server run as root made or read files anywhere the mount's user
// pointed it (TestHostileRenameRaceUnderTheMount). Every operation that
// uses paths holds it shared, once, after the freeze gate; a rename that
// moves a directory (or exchanges two objects) and rmdir hold it
// exclusively, until go-fuse's tree has the change too.
type names struct{ mu sync.RWMutex }

func (m *names) shared() func() {
	m.mu.RLock()
	return m.mu.RUnlock
}

// exclusive holds the names; the function returned ends the hold once
// settled reports that go-fuse's tree shows the change (go-fuse moves or
// drops the node after the operation returns, before it replies to the
// kernel; a path made from the tree before that names the old place).
// settled nil: at once.
func (m *names) exclusive() func(settled func() bool) {
	m.mu.Lock()
	return func(settled func() bool) {
		if settled == nil || settled() {
			m.mu.Unlock()
			return
		}
		go func() {
			// Microseconds: the update follows the return in the same
			// goroutine. The deadline only keeps a surprise from
			// stopping the mount.
			deadline := time.Now().Add(time.Second)
			for i := 0; !settled() && time.Now().Before(deadline); i++ {
				if i < 100 {
					runtime.Gosched()
				} else {
					time.Sleep(50 * time.Microsecond)
				}
			}
			m.mu.Unlock()
		}()
	}
}

// renameHold holds the names for a rename of name in n: exclusively when
// it may move a directory (the moved object is a directory, or not
// known, or two objects are exchanged), else shared. The function returned
// ends the hold; err is the rename's.
func (n *node) renameHold(name string, np *node, newName string, flags uint32) func(err error) {
	src := n.GetChild(name)
	dir := src == nil || src.StableAttr().Mode&unix.S_IFMT == unix.S_IFDIR || src.StableAttr().Mode == 0
	if flags&unix.RENAME_EXCHANGE == 0 && !dir {
		unlock := n.fs.names.shared()
		return func(error) { unlock() }
	}
	release := n.fs.names.exclusive()
	dst := np.GetChild(newName)
	parent, newParent := n.EmbeddedInode(), np.EmbeddedInode()
	return func(err error) {
		if err != nil {
			release(nil)
			return
		}
		release(func() bool {
			if flags&unix.RENAME_EXCHANGE != 0 {
				return at(src, newParent, newName) && at(dst, parent, name)
			}
			return at(src, newParent, newName)
		})
	}
}

// at reports whether go-fuse's tree has the node ch (nil: none known) as
// name in parent.
func at(ch *fusefs.Inode, parent *fusefs.Inode, name string) bool {
	return ch == nil || parent.GetChild(name) == ch
}

// rmdirHold holds the names exclusively for the removal of the directory
// name in n; the function returned ends the hold once go-fuse dropped the
// node (err nil) or at once.
func (n *node) rmdirHold(name string) func(err error) {
	release := n.fs.names.exclusive()
	ch := n.GetChild(name)
	return func(err error) {
		if err != nil || ch == nil {
			release(nil)
			return
		}
		release(func() bool { return n.GetChild(name) != ch })
	}
}
