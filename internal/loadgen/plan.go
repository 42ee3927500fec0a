package loadgen

import (
	"encoding/binary"
	"math/rand/v2"
	"sort"
	"strconv"
)

const logicalBits = 18

// txnKind is what a planned transaction does.
type txnKind uint8

const (
	kindPut txnKind = iota
	kindDelete
	kindRollback // prewritten, then rolled back: only an 'R' record at start_ts
)

// txn is one planned transaction on one row.
type txn struct {
	table, handle     int64
	startTS, commitTS uint64 // commitTS == startTS for a rollback
	kind              txnKind
	lock              bool // also emit lock-CF put (prewrite) and delete (commit)
}

// planBatch is one ApplyBatch before encoding.
type planBatch struct {
	region   uint64
	resolved uint64
	txns     []txn // empty for a heartbeat
}

// clock is a region's TSO clock.
type clock struct{ phys, logical uint64 }

func (c *clock) ts() uint64 { return c.phys<<logicalBits | c.logical }

// tick moves the clock strictly forward and returns the new ts.
func (c *clock) tick(rng *rand.Rand) uint64 {
	c.logical += 1 + rng.Uint64N(4)
	if rng.IntN(16) == 0 || c.logical >= 1<<logicalBits-8 {
		c.phys += 1 + rng.Uint64N(3)
		c.logical = rng.Uint64N(4)
	}
	return c.ts()
}

// region is the planner's state of one region.
type region struct {
	id          uint64
	clk         clock
	pending     []txn
	pendingEvs  int
	sentCommit  uint64 // largest commit ts sent
	dataBatches int
}

// planner produces the load's batches, in output order, from Config alone.
// Both Mutations and Generator consume it, so they agree by construction.
type planner struct {
	cfg     Config
	rng     *rand.Rand
	regions []*region
	done    int // transactions planned
	out     []planBatch
	final   bool
	maxRes  uint64
}

func newPlanner(cfg Config) *planner {
	cfg = cfg.withDefaults()
	p := &planner{
		cfg: cfg,
		rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x666c6f776c6f67)), // "flowlog"
	}
	base := uint64(cfg.StartTime.UnixMilli())
	for r := range cfg.Regions {
		p.regions = append(p.regions, &region{id: uint64(r + 1), clk: clock{phys: base}})
	}
	return p
}

// next returns the next batch, or ok=false at the end of the load.
func (p *planner) next() (planBatch, bool) {
	for len(p.out) == 0 {
		if p.done < p.cfg.Events {
			p.planTxn()
			continue
		}
		if p.final {
			return planBatch{}, false
		}
		p.finish()
	}
	b := p.out[0]
	p.out = p.out[1:]
	if b.resolved > p.maxRes {
		p.maxRes = b.resolved
	}
	return b, true
}

// planTxn plans one transaction and queues its region's batch when full.
func (p *planner) planTxn() {
	p.done++
	rng := p.rng
	r := p.regions[rng.IntN(len(p.regions))]
	table := p.cfg.Tables[rng.IntN(len(p.cfg.Tables))]
	n := len(p.regions)
	perRegion := (p.cfg.Rows - int(r.id-1) + n - 1) / n // handles h < Rows with h%n == id-1
	handle := int64(int(r.id-1) + n*rng.IntN(max(perRegion, 1)))
	t := txn{table: table, handle: handle, kind: kindPut}
	switch x := rng.Float64(); {
	case x < 0.01:
		t.kind = kindRollback
	case x < 0.01+max(p.cfg.DeleteRatio, 0)*0.99:
		t.kind = kindDelete
	}
	t.lock = rng.IntN(50) == 0
	t.startTS = r.clk.tick(rng)
	t.commitTS = t.startTS
	if t.kind != kindRollback {
		t.commitTS = r.clk.tick(rng)
	}
	r.pending = append(r.pending, t)
	r.pendingEvs += p.eventsOf(t)
	if r.pendingEvs >= p.cfg.BatchSize {
		p.flush(r)
		r.dataBatches++
		if p.cfg.HeartbeatEvery > 0 && r.dataBatches%p.cfg.HeartbeatEvery == 0 {
			// Nothing of r is pending, and later transactions take
			// later ts, so resolving up to the clock is safe.
			p.out = append(p.out, planBatch{region: r.id, resolved: r.clk.tick(rng)})
		}
	}
}

// eventsOf is the number of apply events t is written as.
func (p *planner) eventsOf(t txn) int {
	n := 1
	if t.kind == kindPut && p.cfg.ValueSize > maxShortValue {
		n++
	}
	if t.lock {
		n += 2
	}
	return n
}

// flush queues r's pending transactions as one batch.
func (p *planner) flush(r *region) {
	for _, t := range r.pending {
		r.sentCommit = max(r.sentCommit, t.commitTS)
	}
	p.out = append(p.out, planBatch{region: r.id, resolved: r.sentCommit, txns: r.pending})
	r.pending, r.pendingEvs = nil, 0
}

// finish queues every region's partial batch, then one heartbeat per region
// at one common resolved ts past every region's clock.
func (p *planner) finish() {
	p.final = true
	var final uint64
	for _, r := range p.regions {
		if len(r.pending) > 0 {
			p.flush(r)
		}
		final = max(final, r.clk.tick(p.rng))
	}
	for _, r := range p.regions {
		p.out = append(p.out, planBatch{region: r.id, resolved: final})
	}
}

const maxShortValue = 255

// rowKey is the raw TiKV row key of (table, handle), built here rather than
// with the event package so the oracle stays independent of the codec.
func rowKey(table, handle int64) []byte {
	k := make([]byte, 0, 19)
	k = append(k, 't')
	k = binary.BigEndian.AppendUint64(k, uint64(table)^1<<63)
	k = append(k, '_', 'r')
	return binary.BigEndian.AppendUint64(k, uint64(handle)^1<<63)
}

// value is the deterministic value of a row version: the marker, a row tag
// and printable pseudo-random filler up to size bytes.
func value(seed, table, handle int64, version uint64, size int) []byte {
	v := make([]byte, 0, size)
	v = append(v, Marker...)
	v = append(v, 't')
	v = strconv.AppendInt(v, table, 10)
	v = append(v, 'h')
	v = strconv.AppendInt(v, handle, 10)
	v = append(v, '-')
	x := uint64(seed)*0x9e3779b97f4a7c15 ^ uint64(table)*0xbf58476d1ce4e5b9 ^ uint64(handle)*0x94d049bb133111eb ^ version
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	for len(v) < size {
		x = splitmix(x)
		v = append(v, alphabet[x%uint64(len(alphabet))])
	}
	return v[:size]
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// Mutation is one committed row mutation of the load.
type Mutation struct {
	Table, Handle     int64
	RawKey            []byte // raw TiKV row key
	Region            uint64
	CommitTS, StartTS uint64
	Delete            bool
	Value             []byte // nil for a delete
}

// Mutations returns the committed mutations of the load cfg describes, in
// generation order (per region in commit-ts order). Rolled-back transactions
// are left out. It shares only the seeded plan with Generator, not the
// encoders.
func Mutations(cfg Config) []Mutation {
	p := newPlanner(cfg)
	var out []Mutation
	for {
		b, ok := p.next()
		if !ok {
			return out
		}
		for _, t := range b.txns {
			if t.kind == kindRollback {
				continue
			}
			m := Mutation{Table: t.table, Handle: t.handle, RawKey: rowKey(t.table, t.handle), Region: b.region,
				CommitTS: t.commitTS, StartTS: t.startTS, Delete: t.kind == kindDelete}
			if !m.Delete {
				m.Value = value(p.cfg.Seed, t.table, t.handle, t.commitTS, p.cfg.ValueSize)
			}
			out = append(out, m)
		}
	}
}

// Row is a live row as a restore at some ts must return it.
type Row struct {
	Value    []byte
	CommitTS uint64
}

// Expected returns the table contents as of ts: for every key the newest
// mutation with CommitTS <= ts, deletes removing the key. The result maps
// table id -> raw key (as a string) -> row; tables without live rows are
// absent.
func Expected(muts []Mutation, ts uint64) map[int64]map[string]Row {
	sorted := make([]Mutation, 0, len(muts))
	for _, m := range muts {
		if m.CommitTS <= ts {
			sorted = append(sorted, m)
		}
	}
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].CommitTS < sorted[j].CommitTS })
	out := map[int64]map[string]Row{}
	for _, m := range sorted {
		rows := out[m.Table]
		if rows == nil {
			rows = map[string]Row{}
			out[m.Table] = rows
		}
		if m.Delete {
			delete(rows, string(m.RawKey))
		} else {
			rows[string(m.RawKey)] = Row{Value: m.Value, CommitTS: m.CommitTS}
		}
	}
	for t, rows := range out {
		if len(rows) == 0 {
			delete(out, t)
		}
	}
	return out
}
