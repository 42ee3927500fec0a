package meta

import (
	"strconv"
)

// HashTag is the Redis Cluster hash tag every key carries, so that all of
// flowlog's keys live in one slot and one MULTI can span any of them.
const HashTag = "{flowlog}"

// DefaultPrefix is the default key prefix (--redis-prefix).
const DefaultPrefix = "flowlog"

// Keys builds flowlog's Redis key names under one prefix: every key is
// "<prefix>:{flowlog}:<rest>". Every family it builds is described in
// docs/FORMAT.md, "Redis keys", and docs/format_test.go fails for one that
// is not.
type Keys struct {
	base string // "<prefix>:{flowlog}:"
}

// NewKeys returns the key builder for prefix ("" means DefaultPrefix).
func NewKeys(prefix string) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Keys{base: prefix + ":" + HashTag + ":"}
}

// Base is the common prefix of every key, "<prefix>:{flowlog}:".
func (k Keys) Base() string { return k.base }

func u32(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
func u64(v uint64) string { return strconv.FormatUint(v, 10) }
func i32(v int32) string  { return strconv.FormatInt(int64(v), 10) }

// FlowName is the string key mapping a flow name to its id.
func (k Keys) FlowName(catalog, name string) string {
	return k.base + "flow:name:" + catalog + ":" + name
}

// FlowInfo is the string key holding a flow's FlowInfo JSON.
func (k Keys) FlowInfo(id uint32) string { return k.base + "flow:info:" + u32(id) }

// FlowRoutes is the hash partition_id -> Route JSON of a flow.
func (k Keys) FlowRoutes(id uint32) string { return k.base + "flow:routes:" + u32(id) }

// Flownode is the set of "<flow_id>/<partition_id>" placed on a flownode.
func (k Keys) Flownode(node uint64) string { return k.base + "flownode:" + u64(node) }

// Table is the hash "<flownode_id>/<flow_id>/<partition_id>" -> Route JSON of
// the flows reading a table.
func (k Keys) Table(table uint32) string { return k.base + "table:" + u32(table) }

// Flows is the set of all flow ids.
func (k Keys) Flows() string { return k.base + "flows" }

// FlowSeq is the INCR counter handing out new flow ids.
func (k Keys) FlowSeq() string { return k.base + "flow:seq" }

// FlowState is the hash of a flow's runtime state: status, error,
// checkpoint_ts (and last_flush_ts as versions before LastFlush wrote it).
func (k Keys) FlowState(id uint32) string { return k.base + "flow:state:" + u32(id) }

// DDLOffset is the string holding the next DDL offset applied for a
// partition of the DDL topic.
func (k Keys) DDLOffset(topic string, partition int32) string {
	return k.base + "ddl:offset:" + topic + ":" + i32(partition)
}

// Lease is the hash (member, epoch) of the consumer owning an apply
// partition.
func (k Keys) Lease(topic string, partition int32) string {
	return k.base + "lease:" + topic + ":" + i32(partition)
}

// Offset is the string holding the next apply offset committed for a
// partition.
func (k Keys) Offset(topic string, partition int32) string {
	return k.base + "offset:" + topic + ":" + i32(partition)
}

// Ckpt is the string holding the checkpoint ts of an apply partition: the
// min resolved ts of its live regions at its last commit.
func (k Keys) Ckpt(topic string, partition int32) string {
	return k.base + "ckpt:" + topic + ":" + i32(partition)
}

// Metas is the sorted set of a flow's committed meta object paths, scored by
// min_resolved_ts.
func (k Keys) Metas(id uint32) string { return k.base + "metas:" + u32(id) }

// Coverage is coverage:<flow_id>, the hash of each table's coverage window
// (docs/FORMAT.md, "Coverage rule"). Like metas:<flow_id>, it outlives the
// flow, and its presence marks the id as used for good.
func (k Keys) Coverage(id uint32) string { return k.base + "coverage:" + u32(id) }

// Regions is the hash region id -> last resolved ts of the live regions of an
// apply partition at its last commit. It lets a new owner of the partition
// start with the regions the previous one knew, so its checkpoint cannot pass
// a region it has not heard from.
func (k Keys) Regions(topic string, partition int32) string {
	return k.base + "regions:" + topic + ":" + i32(partition)
}
