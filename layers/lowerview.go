package layers

import (
	"golang.org/x/sys/unix"
)

// LowerView is the original of a sandbox whose lower layers are several:
// their merged view alone, without the upper, as kernel overlayfs shows a
// stack of lower layers (whiteouts, opaque directories and redirects of
// the layers honoured). It only reads.
type LowerView struct{ l *Layers }

// OpenLowerView returns the merged view of cfg's lower layers. It opens
// no journal.
func OpenLowerView(cfg Config) (*LowerView, error) {
	l, err := newLayers(cfg)
	if err != nil {
		return nil, err
	}
	return &LowerView{l: l}, nil
}

// Close closes the layers' directories the view opened.
func (v *LowerView) Close() { v.l.closeLowerRoots() }

// Find returns where the object the view shows at rel lives: the index of
// its layer and its path relative to that layer's root. ok is false when
// the view has nothing at rel.
func (v *LowerView) Find(rel string) (layer int, path string, ok bool, err error) {
	if rel == "" {
		return 0, "", true, nil
	}
	hit, ok, err := v.l.resolveLower(rel)
	if err != nil || !ok {
		return 0, "", false, err
	}
	return hit.origin.Layer, hit.origin.layerPath(), true, nil
}

// ReadDir lists the merged directory rel of the view, in the order
// Layers.ReadDir gives. It answers ENOENT where the view has no directory.
func (v *LowerView) ReadDir(rel string) ([]DirEntry, error) {
	dirs := v.l.lowerDirsAt(rel)
	if len(dirs) == 0 {
		return nil, unix.ENOENT
	}
	return v.l.mergeDir("", nil, dirs)
}
