// Package replay republishes a flow's backup into Kafka as the apply
// stream it was backed up from: ApplyBatch records keyed by the original
// region id (docs/FORMAT.md, "ApplyBatch records" and "Replay records"),
// so that a new store, a cache or a second flowlog can be rebuilt from it.
// docs/RESTORE.md ("Replay") is the operator's view.
//
// # What it reads
//
// Exactly what a restore at To reads, by the same rules (backup.PlanRead):
// the flow, To checked against the checkpoint and the clock, the metas
// listed after the checkpoint was read, the selection (backup.Selection:
// tables and raw key range, chunks that cannot hold a selected key never
// fetched, keys outside the range dropped), and for each selected table the
// coverage window that holds To (tables without one are left out and
// named; none left is refused). Log mode sends every event of those
// windows with From < ts <= To, and the default-CF values at or before
// From (inside the window) that a write-CF put it sends needs: a first
// pass over the write-CF put chunks that may reference such a value
// (min_begin_ts_in_default_cf <= From) collects the keys of the values
// needed, and those are sent before every other event. State mode sends
// the MVCC state at To, computed by the restore's own read
// (sink.ReadState), snapshots included.
//
// # Why each region's events keep their order
//
// A region's records are consumed from one apply partition at a time, in
// offset order, and each cycle (meta) records the offset range of every
// partition it consumed. So the order in which cycles consumed a
// partition's offsets is the order of that partition's records, and a
// topological order of every partition's offset chain (orderCycles) puts
// each region's cycles in the order its records arrived. Ranking cycles by
// one partition's offsets would not: a cycle that holds no records of that
// partition has no place in its chain. Cycles the chains do not order keep
// the meta list's order, by min resolved ts; chains that contradict each
// other fail the replay.
//
// Within a cycle the backup keeps a region's events per table, column
// family and op, each chunk in arrival order, but not how chunks
// interleaved. A region's chunks are sent default-CF puts first, so that
// every value goes before the write-CF put that needs it (a value is
// prewritten before its commit), then write-CF puts, write-CF deletes and
// default-CF deletes, tables in id order. A layout v2 chunk may hold
// several regions' events (docs/FORMAT.md, "Meta objects, version 2"): it
// is sent run by run, each run's entries keyed by the run's region, so a
// region's events in it keep their order. A cycle with such a chunk is
// sent in that order of classes and tables for all its regions at once;
// a cycle of one region per chunk region by region, as replays did before
// chunks held several regions (the same arguments then still write the
// same records). Either way each region's own chunks go in the same
// order. A multi-region chunk's min_ts bounds every region in it for the
// resolved ts below. That is the remaining ordering
// limit: within one cycle, the events of different tables of a region, and
// the write records relative to other tables' values, are not in their
// original interleaving. No reader of the MVCC data can tell: every
// version carries its own ts, and a reader takes the newest version at or
// below a ts whatever order the versions came in.
//
// # Why resolved ts never pass an unsent event
//
// Each chunk's meta says the lowest ts it holds. Walking the ordered jobs
// backwards gives, for each job, the lowest ts any later job of its region
// can send (job.after). After a job, the region's resolved ts is
// min(To, after-1), or To when no later job of the region remains. It only
// grows (after grows along a region's jobs), it is below every event the
// region has still to send, and each region's last record carries To. A
// consumer of the target topic therefore computes a checkpoint that never
// passes missing data, and reaches To.
//
// # Exactly once
//
// The output is a function of the arguments and the backup: the order
// above is deterministic, batches are cut by size, and each record's
// partition is Kafka's default partitioner of its key (murmur2), computed
// here so that the replay knows where each record goes. Every record
// carries the run id (a hash of the flow id, mode, resolved From and To,
// tables, format and topic) and its sequence number in the run's output.
// franz-go's idempotent producer writes each partition's records once and
// in order, and a record fails only together with every later record of
// its partition, so what a killed run left in a partition is a prefix of
// that partition's share of the output. A run first reads the tail of
// every partition (Target.Written) for the highest sequence number of its
// run id, and skips every record at or below it in that partition: the
// topic ends up holding each record once, in order, as one uninterrupted
// run would have written it. The partition count of the topic must not
// change between the runs.
//
// # Memory
//
// Chunks are read whole and checked (sink.OpenChunk), Parallel at a time,
// while the chunks held stay within MaxMemory less the producer's queue
// (ProducerMemory, a quarter, at most 32 MiB); a chunk larger than that is
// read alone. The log plan holds, per chunk, its file entry without keys;
// the values needed from before From are held as a set of their keys,
// within a quarter of MaxMemory (beyond it the replay fails and says to
// raise it). State mode's memory is the restore's.
package replay
