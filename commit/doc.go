// Package commit applies a sandbox's change set to its original, atomically
// and crash-safely, and rolls it back.
//
// A commit runs as one transaction (Txn):
//
//  1. Prepare: compute the change set from the journal; check conflicts
//     (the original changed after the sandbox first changed it); stage every
//     new object in the transaction directory on the original's filesystem
//     (a hard link of the upper object when the upper shares that
//     filesystem, a copy otherwise) and make it durable; write the undo log
//     (the whole plan) and fsync it. The original is not touched yet.
//  2. Apply: renamed directories are moved aside and then to their new
//     names (O(1) each); then, parents first, every path that goes away or is
//     replaced is moved into the backup area (a rename, never a data copy)
//     and every new object is renamed into place; then metadata, children
//     first. Every step goes through a directory descriptor opened beneath
//     the original root with RESOLVE_NO_SYMLINKS, so nothing outside the
//     root is ever written.
//  3. Commit point: syncfs of the original's filesystem and a check that
//     nobody wrote to an object moved into the backups (Sync), then the
//     undo log is rewritten with state "committed" and fsynced.
//  4. Cleanup: the backups and the transaction directory are removed, then
//     the undo log.
//
// Rules the code keeps (must):
//
//   - The undo log is durable before the first change to the original.
//   - Every undo step checks the state it finds (is the backup there, is the
//     object at the path the one we put there) so undo can run any number of
//     times, after a crash at any point, and never deletes data it cannot
//     put back: a backup that cannot be restored stays where it is and is
//     reported.
//   - Undo runs in reverse order and goes on past a failed step.
//   - Recovery of a transaction that did not reach its commit point undoes
//     it (all-old); one that did is finished (all-new). A plan of several
//     sandboxes decides from its own record (see manager).
package commit
