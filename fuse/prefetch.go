package fuse

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Directory prefetch.
//
// A walk (find, a build's scan, rm -r, an editor's file tree) lists a
// directory, then enters its subdirectories one after the other. On a cold
// cache each of them costs the server a read of the directory's inode and
// blocks from disk while the walk waits, one at a time, where kernel
// overlayfs waits for the same reads inside the kernel. So when sbxfs lists
// a directory of an original, it hands the original's subdirectories to a
// few background readers, in the order the walk will enter them (cookie
// order), which read them (open, getdents to the end) and throw the result
// away: the walk then finds their inodes and blocks in the kernel's caches.
// Nothing else depends on it: what the server answers is read when it
// answers, as before.
//
// The readers and their queue are the process's, shared by its mounts. The
// queue is bounded and a listing hands over at most prefetchPerListing
// directories; what does not fit is dropped, never waited for.

const (
	prefetchReaders    = 8
	prefetchQueue      = 4096
	prefetchPerListing = 1024
)

var prefetch struct {
	once sync.Once
	q    chan opener
}

// An opener opens a directory of a lower layer (layers.OpenLowerChild:
// no symlink followed on the way).
type opener func() (int, error)

// prefetchDirs queues the directories dirs opens for the background
// readers; full, it drops the rest.
func prefetchDirs(dirs []opener) {
	prefetch.once.Do(func() {
		prefetch.q = make(chan opener, prefetchQueue)
		for range prefetchReaders {
			go func() {
				buf := make([]byte, 32<<10)
				for open := range prefetch.q {
					readDirBlocks(open, buf)
				}
			}()
		}
	})
	for _, d := range dirs {
		select {
		case prefetch.q <- d:
		default:
			return
		}
	}
}

// readDirBlocks reads the directory open opens to its end, for the
// caches. Errors do not matter.
func readDirBlocks(open opener, buf []byte) {
	fd, err := open()
	if err != nil {
		return
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Getdents(fd, buf)
		if n <= 0 || err != nil {
			return
		}
	}
}
