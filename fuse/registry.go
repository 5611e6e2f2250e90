package fuse

import (
	"slices"
	"sync"

	fusefs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/sbxfs/sbxfs/layers"
)

// registry finds the node go-fuse keeps for a stable identity, which it
// hands the kernel again when a lookup finds that identity under another
// name: an original directory moved behind the sandbox (mv d old in the
// original) is the node of d still, while the kernel holds it (open, or
// its forget not yet sent: under io_uring forgets come in batches). That
// node must then reach its object by the new path; kept as it was, the
// lookups beneath old/ went to whatever d is now
// (TestOriginalDirectoryMovedBehindAnOpenDirectory). go-fuse's own table
// is not exported.
//
// Only nodes of objects of the original are kept (the sandbox's own
// objects move only through it). A node go-fuse set aside for one it
// already had (two lookups racing) is never forgotten through OnForget:
// the next lookup of its identity replaces it, as one the kernel holds no
// reference to (Forgotten). Strong pointers: 40-odd bytes a node, where
// weak ones cost three times that (a walk of 100,000 original files:
// +4.5 MB against +13).
type registry struct {
	mu    sync.Mutex
	nodes map[fusefs.StableAttr]*node
}

// adopt points the live node of sa, if there is one other than child,
// at e: where a lookup found its object now. Else child, set up by
// NewInode (another lookup may read it once it is in the table), is
// the node of sa. (A node another lookup just put in the table, not yet
// in go-fuse's tree, reads as Forgotten for that moment: two lookups of
// one identity at once may leave the loser in the table until the next.)
func (r *registry) adopt(sa fusefs.StableAttr, child *node, e *layers.Entry) {
	if e.Upper {
		return
	}
	r.mu.Lock()
	old := r.nodes[sa]
	if old == nil || old.Forgotten() {
		if r.nodes == nil {
			r.nodes = map[fusefs.StableAttr]*node{}
		}
		r.nodes[sa], old = child, nil
	}
	r.mu.Unlock()
	if old == nil {
		return
	}
	old.mu.Lock()
	if !old.obj.Upper && !slices.Equal(old.obj.Lowers, e.Lowers) {
		old.obj = e.Obj
	}
	old.mu.Unlock()
}

// forget drops n, forgotten by the kernel, from the table.
func (r *registry) forget(sa fusefs.StableAttr, n *node) {
	r.mu.Lock()
	if r.nodes[sa] == n {
		delete(r.nodes, sa)
	}
	r.mu.Unlock()
}

var _ = (fusefs.NodeOnForgetter)((*node)(nil))

// OnForget is called once the kernel forgot n (go-fuse: "the node
// becomes unreachable").
func (n *node) OnForget() { n.fs.registry.forget(n.StableAttr(), n) }
