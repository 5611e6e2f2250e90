// Package fsutil holds the small filesystem tools the rest of sbxfs is built
// on. It imports only the standard library and golang.org/x/sys/unix.
//
//   - Copying: [CopyData] copies file content with FICLONE when the filesystem
//     can share extents, else copy_file_range (or pread/pwrite) over the data
//     extents only, so sparse files stay sparse. [CopyXattrs], [CopyTimes]
//     and [CopyFlags] (the chattr flags a copy keeps) copy metadata.
//   - Inode flags: [Flags], [SetFlags], [FsGetXattr]; [OpenForFlags] opens
//     only a file or directory for them; [HeldFlags] probes which of the
//     carried flags a filesystem keeps. [Lstatx] is lstat through statx,
//     which also tells an immutable or append-only object ([Protection]).
//   - Extended attributes: [ListXattrs], [GetXattr] and their path variants
//     that never follow a symlink, [LListXattrs] and [LGetXattr].
//   - Safe resolution: [CleanRel] validates a path relative to a root;
//     [OpenBeneath] and [OpenDirBeneath] open such a path beneath a directory
//     fd without following any symlink and without leaving the root.
//   - Atomic replacement: [WriteFileAtomic] (temp file, fsync, rename, fsync
//     of the directory), [SyncDir] and [TempName].
//   - Overlay layout: [IsWhiteout] recognises a kernel overlayfs whiteout.
//   - Mounts: [SameMount] tells whether rename(2) between two paths can
//     work (one mount, not just one filesystem); [MountID] names the mount
//     of a descriptor; [IsStaleMount] tells a FUSE mount whose server is
//     gone; [ReadMountinfo] and [MountAt] read the mount table;
//     [FuseConnDir] names a FUSE connection in fusectl and [CutOffFuse]
//     ends one that outlived its unmount (a copy of the mount elsewhere);
//     [UsedElsewhere] finds processes of other mount namespaces using a
//     file system.
//   - JSON: [EncodeRaw] carries a path or attribute name that is not UTF-8
//     byte for byte through sbxfs's own files; [B64IfInvalid] and
//     [FromB64] make and read the `*_b64` companions of what it prints.
//
// Every error is wrapped with context and keeps its errno, so callers can
// test it with errors.Is(err, unix.ENOSPC) or errors.As into a syscall.Errno.
package fsutil
