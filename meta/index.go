package meta

import (
	"context"
	"maps"
	"slices"

	"github.com/redis/go-redis/v9"
)

// indexSet is the index entries of one flow: flownode set
// members, and the table hash fields with their Route JSON, which are the
// same for every table of the flow (one per partition), so they are kept
// once, with the sorted tables they go to.
type indexSet struct {
	flownode map[uint64]map[string]bool // flownode id -> members
	tables   []uint32                   // sorted, without duplicates
	fields   map[string]string          // table hash field -> Route JSON
}

func newIndexSet() indexSet {
	return indexSet{flownode: map[uint64]map[string]bool{}, fields: map[string]string{}}
}

// add adds the entries of flow id with info and routes. The partitions are
// those of info.FlownodeIDs and of routes; a partition's flownode is
// FlownodeIDs[p], else its route's peer; its route is routes[p], else a
// route to that flownode.
func (x *indexSet) add(id FlowID, info FlowInfo, routes map[uint32]Route) {
	parts := map[uint32]uint64{}
	for p, r := range routes {
		parts[p] = r.Peer.ID
	}
	for p, n := range info.FlownodeIDs {
		parts[p] = n
	}
	for p, node := range parts {
		r, ok := routes[p]
		if !ok {
			r = Route{Peer: Peer{ID: node}}
		}
		member := u32(id) + "/" + u32(p)
		if x.flownode[node] == nil {
			x.flownode[node] = map[string]bool{}
		}
		x.flownode[node][member] = true
		x.fields[u64(node)+"/"+member] = encodeRoute(r)
	}
	x.tables = slices.Compact(slices.Sorted(slices.Values(append(x.tables, info.SourceTableIDs...))))
}

// sameFields reports whether x and y write the same table hash fields.
func (x indexSet) sameFields(y indexSet) bool { return maps.Equal(x.fields, y.fields) }

// removeFlownodes queues removal of x's flownode members.
func (x indexSet) removeFlownodes(ctx context.Context, p redis.Pipeliner, k Keys) {
	for node, members := range x.flownode {
		p.SRem(ctx, k.Flownode(node), toAny(slices.Collect(maps.Keys(members)))...)
	}
}

// writeFlownodes queues writing x's flownode members.
func (x indexSet) writeFlownodes(ctx context.Context, p redis.Pipeliner, k Keys) {
	for node, members := range x.flownode {
		p.SAdd(ctx, k.Flownode(node), toAny(slices.Collect(maps.Keys(members)))...)
	}
}

// remove queues removal of every entry of x.
func (x indexSet) remove(ctx context.Context, p redis.Pipeliner, k Keys) {
	x.removeFlownodes(ctx, p, k)
	x.removeTables(ctx, p, k, x.tables)
}

// write queues writing every entry of x.
func (x indexSet) write(ctx context.Context, p redis.Pipeliner, k Keys) {
	x.writeFlownodes(ctx, p, k)
	x.writeTables(ctx, p, k, x.tables)
}

// removeTables queues removal of x's fields from the hashes of tables.
func (x indexSet) removeTables(ctx context.Context, p redis.Pipeliner, k Keys, tables []uint32) {
	if len(tables) == 0 || len(x.fields) == 0 {
		return
	}
	args := []any{k.base + "table:", packTables(tables), "hdel"}
	for _, f := range slices.Sorted(maps.Keys(x.fields)) {
		args = append(args, f)
	}
	p.Eval(ctx, tableIndexScript, []string{k.Flows()}, args...)
}

// writeTables queues writing x's fields to the hashes of tables.
func (x indexSet) writeTables(ctx context.Context, p redis.Pipeliner, k Keys, tables []uint32) {
	if len(tables) == 0 || len(x.fields) == 0 {
		return
	}
	args := []any{k.base + "table:", packTables(tables), "hset"}
	for _, f := range slices.Sorted(maps.Keys(x.fields)) {
		args = append(args, f, x.fields[f])
	}
	p.Eval(ctx, tableIndexScript, []string{k.Flows()}, args...)
}

// tableIndexScript sets or deletes the same fields in the table hashes of
// many tables in one command: ARGV[1] is the table key prefix, ARGV[2] the
// tables as packed big-endian uint32s (packTables), ARGV[3] "hset" or
// "hdel", the rest the fields (hset: field, value pairs). One command per
// DDL instead of one per table keeps a DDL of 100,000 tables to a few
// hundred KB on the client, and it runs inside the DDL's MULTI. KEYS[1] is
// a key of the same slot ({flowlog}), so a cluster routes it with the
// table keys it touches.
const tableIndexScript = `
local prefix, packed, op = ARGV[1], ARGV[2], ARGV[3]
local rest = {}
for i = 4, #ARGV do rest[#rest + 1] = ARGV[i] end
for i = 1, #packed, 4 do
	local a, b, c, d = string.byte(packed, i, i + 3)
	local key = prefix .. string.format('%d', ((a * 256 + b) * 256 + c) * 256 + d)
	if op == 'hset' then
		redis.call('HSET', key, unpack(rest))
	else
		redis.call('HDEL', key, unpack(rest))
	end
end
return #packed / 4
`
