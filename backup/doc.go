// Package backup is the read side of flowlog's guarantees: it decides what a
// restore, a snapshot, a truncate and gc may read, keep or remove, from the
// flow metadata in Redis (meta) and the objects in the bucket (sink). The
// write side, the consumer's flush cycle and commit, puts the events in the
// backup; this package makes sure a reader gets back exactly the ones that
// are provably there. A command line parses flags and words the typed errors
// and events this package returns; it decides nothing about them.
// docs/FORMAT.md ("Restore rule", "Coverage rule", "Snapshot rule",
// "Truncate rule") states the same rules against the keys and objects.
//
// # Why a restore it allows is complete
//
// Restore as of T writes, for each table it restores, the table's MVCC state
// at T computed from the events of one coverage window of the table. Every
// event that state needs is read, because each of the following holds.
//
// The checkpoint. A flow's checkpoint C is the minimum, over the apply
// partitions with records, of each partition's committed checkpoint, the
// lowest resolved ts of its live regions; it never moves backwards. A
// partition's checkpoint moves only in the transaction that commits the
// cycle holding the events below it and lists that cycle's meta in
// metas:<flow_id>. So every event with commit ts <= C is in a listed meta.
// Restore refuses a T above C (PastCheckpointError): past C, events may
// still be in flight.
//
// The clock. A ts further ahead of this machine's clock than the allowed
// skew cannot come from an honest clock: the consumer sends such records to
// its DLQ, so none of them moves C. A T there names data that cannot exist
// yet, and a C there was moved by a ts no clock gave (a version that took
// any ts), so what it claims is unproven at any T: both are refused
// (FutureError).
//
// The read order. Restore reads C before it lists the metas. A commit only
// adds metas, so a list taken after C was read holds every cycle C covers,
// even when a cycle commits and C moves between the two reads. Read the
// other way round, a cycle committed in between would be below the new C and
// missing from the old list.
//
// Coverage windows. A change stream holds only what happened after the flow
// started to receive a table, so each table has windows [since, until]. The
// commit transactions set since once every apply partition with records has
// routed past the DDL that added the table, and until once every one has
// stopped routing it; every event of the table with since < ts <=
// min(C, until) is then in exactly one listed chunk. Restore writes a table
// only if one of its windows holds T, reads only that window's events (an
// older window's events could hide a newer version across the gap), and
// reports every table it leaves out (LeftOut); with none left it fails
// (UncoveredError). A dropped flow's checkpoint is the consumer group's
// global_checkpoint object, which stops at the drop; once all its windows
// are closed, each end was reported by every partition together with the
// data before it, so the flow is restorable up to their end whatever the
// object says.
//
// Truncation. Truncate removes a meta only when it lies at or below a listed
// snapshot S and holds no value a put committed after S needs, and only
// when that snapshot holds every table whose window holds S, cut from that
// window (IncompleteSnapshotError otherwise). It removes the metas and
// records truncated_before = S in one transaction, which plans again on
// what it reads if a commit changed the lists. Restore reads the truncation
// point after it lists the metas and the snapshots, so it knows of every
// truncation its lists reflect, and refuses T < S (TruncatedError).
//
// Snapshots. A snapshot at S is the state at S of one window, computed from
// the same listed metas exactly as a restore computes it, and counts only
// once it is listed, after all its objects are written. Restore starts a
// table from the newest listed snapshot at or below T cut from the window
// that holds T, and reads the log after S only: the same events the log alone
// gives above S, on the same state at S. A table whose window began below
// the truncation point and has no such snapshot is refused (TruncatedError
// with its table), never read from a log that lost its start.
//
// gc deletes only objects that no listed meta or snapshot references
// (GCRefs) and that are older than its grace period, so it never removes
// what a restore may read.
package backup
