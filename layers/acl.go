package layers

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// POSIX ACLs are extended attributes in the kernel's xattr format
// (include/uapi/linux/posix_acl_xattr.h): a 4-byte little-endian version
// (2), then 8-byte entries of tag (2 bytes), permission bits (2) and id (4).
const (
	xattrACLAccess  = "system.posix_acl_access"
	xattrACLDefault = "system.posix_acl_default"

	aclVersion  = 2
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
)

// perms is how a new object gets its permission bits and ACLs.
type perms struct {
	mode   uint32 // the permission bits, special bits included
	access []byte // the access ACL to set, nil when mode says it all
	dflt   []byte // a new directory's default ACL, inherited
}

// newPerms works out the permissions of an object made with mode (the
// file type bits, the permission bits the caller asked for before its
// umask) in the directory dir, as ext4 does (posix_acl_create): when dir
// has a default ACL the object gets it as its access ACL, masked by mode,
// a directory keeps it as its default ACL too, and the umask does not
// apply; otherwise the mode is masked by the caller's umask.
func newPerms(dir string, mode uint32, c Caller) (perms, error) {
	p := perms{mode: mode & 0o7777}
	def, err := fsutil.LGetXattr(dir, xattrACLDefault)
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP), err == nil && len(def) == 0:
		// No default ACL, or none possible on this filesystem.
		p.mode &^= c.Umask & 0o777
		return p, nil
	case err != nil:
		return perms{}, err
	}
	access, m, err := aclCreateMasq(def, p.mode)
	if err != nil {
		return perms{}, fmt.Errorf("default ACL of %s: %w", dir, err)
	}
	p.mode, p.access = m, access
	if mode&unix.S_IFMT == unix.S_IFDIR {
		p.dflt = def
	}
	return p, nil
}

// setACLs gives the object at path the ACLs of p.
func (p *perms) setACLs(path string) error {
	if p.dflt != nil {
		if err := unix.Lsetxattr(path, xattrACLDefault, p.dflt, 0); err != nil {
			return err
		}
	}
	if p.access != nil {
		return unix.Lsetxattr(path, xattrACLAccess, p.access, 0)
	}
	return nil
}

// setACLsFd is setACLs for an open file.
func (p *perms) setACLsFd(fd int) error {
	if p.access != nil {
		return unix.Fsetxattr(fd, xattrACLAccess, p.access, 0)
	}
	return nil
}

// aclCreateMasq is the kernel's posix_acl_create_masq: the access ACL a
// new object with permission bits mode gets from the default ACL def (nil
// when it is equivalent to the mode alone: no named users or groups, no
// mask), and the object's mode.
func aclCreateMasq(def []byte, mode uint32) ([]byte, uint32, error) {
	if len(def) < 4 || (len(def)-4)%8 != 0 || binary.LittleEndian.Uint32(def) != aclVersion {
		return nil, 0, errors.New("not a POSIX ACL")
	}
	acl := append([]byte(nil), def...)
	perm := func(i int) uint32 { return uint32(binary.LittleEndian.Uint16(acl[i+2:])) }
	setPerm := func(i int, v uint32) { binary.LittleEndian.PutUint16(acl[i+2:], uint16(v)) }
	m := mode
	groupObj, maskObj := -1, -1
	equiv := true
	for i := 4; i < len(acl); i += 8 {
		switch binary.LittleEndian.Uint16(acl[i:]) {
		case aclUserObj:
			setPerm(i, perm(i)&(m>>6|^uint32(0o7)))
			m &= perm(i)<<6 | ^uint32(0o700)
		case aclUser, aclGroup:
			equiv = false
		case aclGroupObj:
			groupObj = i
		case aclOther:
			setPerm(i, perm(i)&(m|^uint32(0o7)))
			m &= perm(i) | ^uint32(0o7)
		case aclMask:
			maskObj = i
			equiv = false
		default:
			return nil, 0, errors.New("unknown ACL entry tag")
		}
	}
	g := maskObj
	if g < 0 {
		g = groupObj
	}
	if g < 0 {
		return nil, 0, errors.New("ACL without a group entry")
	}
	setPerm(g, perm(g)&(m>>3|^uint32(0o7)))
	m &= perm(g)<<3 | ^uint32(0o70)
	mode = mode&^0o777 | m&0o777
	if equiv {
		return nil, mode, nil
	}
	return acl, mode, nil
}
