package rebuild

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

// Input is what a recovery is planned from.
type Input struct {
	Bucket sink.Bucket
	Prefix string // --gcs-prefix
	Group  string // the consumer group whose backup is recovered
	// ApplyTopic and ApplyPartitions name the apply topic's partitions;
	// Committed are the group's committed Kafka offsets of them (absent:
	// none), what the bucket cannot say: progress of cycles that uploaded
	// nothing because they had neither chunks nor coverage reports.
	ApplyTopic      string
	ApplyPartitions []int32
	Committed       map[int32]int64
	// DDLTopic and DDLEnds are the DDL topic and its end offsets, where a
	// DDL partition starts that no catalog records a DDL of.
	DDLTopic string
	DDLEnds  map[int32]int64
	Now      time.Time
	Parallel int // metas read at once (default 4)
}

// Plan is what a recovery writes, and why (Print shows it).
type Plan struct {
	Group string
	// Checkpoint is the group's global checkpoint object; CheckpointPath
	// its name ("" if the bucket has none).
	Checkpoint     uint64
	CheckpointPath string
	// FlowCheckpoints are the v1 per-flow checkpoint objects of flows, read
	// when the group has no global checkpoint object (a layout v1 backup).
	FlowCheckpoints map[uint32]uint64
	Catalogs        []sink.Catalog // the newest catalog of every flow id, by id
	OtherGroups     int            // catalogs of other consumer groups, ignored
	// Metas are every meta under the prefix, with the verdict of the
	// choice (Bad ones are left out).
	Metas    []MetaInfo
	Verdicts []Verdict // per meta
	// Listed are the metas each flow id's metas:<flow_id> lists, and
	// Truncated how many chosen ones its truncation point leaves out.
	Listed     map[uint32][]MetaInfo
	Truncated  map[uint32]int
	Uncatalog  []uint32 // flow ids with chunks but no catalog
	Duplicates []Duplicate
	Gaps       []Gap
	Parts      []PartitionPlan
	DDLTopic   string
	DDL        []DDLPlan
	FlowSeq    uint32
	// Reports are the coverage reports of the chosen metas for entries the
	// catalogs still list as pending.
	Reports []sink.CoverageReport
}

// PartitionPlan is what a recovery writes for one apply partition.
type PartitionPlan struct {
	Partition
	ChainEnd int64 // end of the chosen metas' ranges; -1: none
	Kafka    int64 // the group's committed Kafka offset; -1: none
	Offset   int64 // offset:<topic>:<p>, the larger of the two; -1: none written
	// State is the partition commit of the chosen meta ending the chain
	// (ckpt, maxts, regions); nil when no v2 meta has one.
	State *sink.PartitionState
	// MaxTS is maxts:<topic>:<p>: State's, or the clock when Kafka is
	// ahead of the chain or no meta says (a coverage window may only
	// start after records whose ts nothing recorded).
	MaxTS uint64
}

// DDLPlan is ddl:offset of one DDL partition, and where it comes from.
type DDLPlan struct {
	Partition int32
	Next      int64
	FromEnd   bool // no catalog records a DDL of it: its end offset
}

// ErrNoBackup is returned by Build for a prefix that holds no backup of
// the group.
var ErrNoBackup = errors.New("no backup of the group under the prefix")

// Build reads the bucket and plans the recovery.
func Build(ctx context.Context, in Input) (*Plan, error) {
	if in.Parallel <= 0 {
		in.Parallel = 4
	}
	p := &Plan{Group: in.Group, Listed: map[uint32][]MetaInfo{}, Truncated: map[uint32]int{}, FlowCheckpoints: map[uint32]uint64{}}
	// The checkpoint first: what the metas listed after it hold is at
	// least what it claims.
	p.CheckpointPath = sink.CheckpointPathV2(in.Prefix, in.Group)
	ts, err := sink.ReadCheckpoint(ctx, in.Bucket, p.CheckpointPath)
	switch {
	case errors.Is(err, sink.ErrNotExist):
		p.CheckpointPath = ""
	case err != nil:
		return nil, err
	default:
		p.Checkpoint = ts
	}
	l, err := list(ctx, in.Bucket, in.Prefix, in.Group)
	if err != nil {
		return nil, err
	}
	p.OtherGroups = l.other
	for _, id := range sortedKeys(l.catalogs) {
		c := l.catalogs[id].Catalog
		p.Catalogs = append(p.Catalogs, c)
		if p.CheckpointPath != "" {
			continue
		}
		ts, err := sink.ReadCheckpoint(ctx, in.Bucket, sink.CheckpointPath(in.Prefix, c.Catalog, c.Name, in.Group, id))
		switch {
		case errors.Is(err, sink.ErrNotExist):
		case err != nil:
			return nil, err
		default:
			p.FlowCheckpoints[id] = ts
		}
	}
	metas, err := readMetas(ctx, in.Bucket, in.Prefix, in.Group, append(l.v2, l.v1...), in.Parallel)
	if err != nil {
		return nil, err
	}
	p.Metas = metas
	if len(p.Catalogs) == 0 && !slices.ContainsFunc(metas, func(m MetaInfo) bool { return m.Bad == "" }) {
		return nil, fmt.Errorf("%w %q (group %q)", ErrNoBackup, in.Prefix, in.Group)
	}
	p.choose()
	if err := p.truncate(ctx, in); err != nil {
		return nil, err
	}
	p.partitions(in)
	p.ddl(in)
	p.coverage()
	return p, nil
}

// choose runs Choose over the v2 metas together and over each flow's v1
// metas apart (a v1 meta is one flow's share of a cycle), and lists the
// chosen and kept ones for their flows.
func (p *Plan) choose() {
	p.Verdicts = make([]Verdict, len(p.Metas))
	groups := map[int64][]int{} // -1: v2; else the v1 flow id
	for i := range p.Metas {
		m := &p.Metas[i]
		if m.Bad == "" && m.Files > 0 && !slices.ContainsFunc(m.Offsets, func(r sink.OffsetRange) bool { return r.To > r.From }) {
			m.Bad = "holds chunks but no offsets: no commit lists such a meta"
		}
		switch {
		case m.Bad != "":
			p.Verdicts[i] = Dropped
		case m.Version == sink.MetaVersion:
			groups[int64(m.FlowID)] = append(groups[int64(m.FlowID)], i)
		default:
			groups[-1] = append(groups[-1], i)
		}
	}
	for _, g := range sortedKeys(groups) {
		idx := groups[g]
		cands := make([]Candidate, len(idx))
		for j, i := range idx {
			cands[j] = Candidate{Path: p.Metas[i].Path, Ranges: p.Metas[i].Offsets}
		}
		ch := Choose(cands)
		for j, v := range ch.Verdicts {
			p.Verdicts[idx[j]] = v
		}
		for _, d := range ch.Duplicates {
			d.Candidate = idx[d.Candidate]
			p.Duplicates = append(p.Duplicates, d)
		}
		if g == -1 {
			p.Gaps = append(p.Gaps, ch.Gaps...)
		}
	}
	seq := uint32(0)
	named := map[uint32]bool{}
	for _, c := range p.Catalogs {
		seq = max(seq, c.FlowID)
		named[c.FlowID] = true
	}
	chunks := map[uint32]bool{}
	for i, m := range p.Metas {
		if m.Bad != "" {
			continue
		}
		for _, f := range m.Named {
			seq = max(seq, f.FlowID)
		}
		seq = max(seq, m.FlowID)
		if p.Verdicts[i] == Dropped {
			continue
		}
		for _, id := range m.Flows {
			seq = max(seq, id)
			p.Listed[id] = append(p.Listed[id], m)
		}
		for _, id := range m.Chunked {
			chunks[id] = true
		}
	}
	for _, id := range sortedKeys(chunks) {
		if !named[id] {
			p.Uncatalog = append(p.Uncatalog, id)
		}
	}
	p.FlowSeq = seq
}

// truncate leaves out of a truncated flow's list the metas its truncate
// removed (the truncate rule of docs/FORMAT.md, applied again at the
// catalog's truncated_before): truncate deletes v1 objects but leaves v2
// ones to gc, so they may still be in the bucket.
func (p *Plan) truncate(ctx context.Context, in Input) error {
	for _, c := range p.Catalogs {
		listed := p.Listed[c.FlowID]
		if c.TruncatedBefore == 0 || len(listed) == 0 {
			continue
		}
		paths := make([]string, len(listed))
		for i, m := range listed {
			paths[i] = m.Path
		}
		f := sink.Flow{Prefix: in.Prefix, Catalog: c.Catalog, Name: c.Name, ID: c.FlowID}
		sums, err := sink.ReadMetaSummaries(ctx, in.Bucket, f, paths, c.TruncatedBefore, in.Parallel)
		if err != nil {
			return fmt.Errorf("flow %s: %w", f, err)
		}
		drop, _ := sink.PlanTruncate(sums, c.TruncatedBefore)
		gone := map[int]bool{}
		for _, i := range drop {
			gone[i] = true
		}
		var keep []MetaInfo
		for i, m := range listed {
			if !gone[i] {
				keep = append(keep, m)
			}
		}
		p.Listed[c.FlowID], p.Truncated[c.FlowID] = keep, len(drop)
	}
	return nil
}

// partitions plans each apply partition's offset and state: the offset is
// the larger of the chosen chain's end and the group's Kafka commit (Kafka
// is committed after Redis, so it is never ahead of a commit; it is ahead
// of the chain where the last cycles uploaded nothing).
func (p *Plan) partitions(in Input) {
	ends := map[Partition]int64{}
	states := map[Partition]*sink.PartitionState{}
	for i, m := range p.Metas {
		if m.Bad != "" || p.Verdicts[i] == Dropped {
			continue
		}
		for _, r := range m.Offsets {
			if r.Topic == in.ApplyTopic {
				k := Partition{r.Topic, r.Partition}
				if e, ok := ends[k]; !ok || r.To > e {
					ends[k] = r.To
				}
			}
		}
		for j := range m.Partitions {
			st := &m.Partitions[j]
			k := Partition{st.Topic, st.Partition}
			if st.Topic == in.ApplyTopic && (states[k] == nil || st.NextOffset > states[k].NextOffset) {
				states[k] = st
			}
		}
	}
	now := event.ComposeTS(in.Now.UnixMilli(), 0)
	parts := slices.Clone(in.ApplyPartitions)
	for k := range ends {
		if !slices.Contains(parts, k.Partition) {
			parts = append(parts, k.Partition)
		}
	}
	slices.Sort(parts)
	for _, n := range parts {
		k := Partition{in.ApplyTopic, n}
		pp := PartitionPlan{Partition: k, ChainEnd: -1, Kafka: -1, Offset: -1, State: states[k]}
		if e, ok := ends[k]; ok {
			pp.ChainEnd = e
		}
		if st := pp.State; st != nil {
			pp.ChainEnd = max(pp.ChainEnd, st.NextOffset)
		}
		if o, ok := in.Committed[n]; ok {
			pp.Kafka = o
		}
		pp.Offset = max(pp.ChainEnd, pp.Kafka)
		switch {
		case pp.Offset < 0:
		case pp.State != nil && pp.State.NextOffset == pp.Offset:
			pp.MaxTS = pp.State.MaxTS
		default:
			pp.MaxTS = now
			if pp.State != nil {
				pp.MaxTS = max(pp.MaxTS, pp.State.MaxTS)
			}
		}
		p.Parts = append(p.Parts, pp)
	}
}

// ddl plans ddl:offset: the largest next offset a catalog records of each
// DDL partition (the DDL after the last one that changed a flow are
// applied again: they changed no flow, or their change is not in any
// catalog yet), else the partition's end offset.
func (p *Plan) ddl(in Input) {
	p.DDLTopic = in.DDLTopic
	next := map[int32]int64{}
	for _, c := range p.Catalogs {
		if c.DDL != nil && c.DDL.Topic == in.DDLTopic {
			next[c.DDL.Partition] = max(next[c.DDL.Partition], c.DDL.Next)
		}
	}
	for _, n := range sortedKeys(in.DDLEnds) {
		d := DDLPlan{Partition: n}
		if v, ok := next[n]; ok {
			d.Next = v
		} else {
			d.Next, d.FromEnd = in.DDLEnds[n], true
		}
		p.DDL = append(p.DDL, d)
	}
}

// coverage keeps the coverage reports of the chosen metas that are for
// entries still pending in their flow's catalog.
func (p *Plan) coverage() {
	pending := map[[2]uint64]bool{}
	for _, c := range p.Catalogs {
		for _, e := range c.Pending {
			pending[[2]uint64{uint64(c.FlowID), e.Seq}] = true
		}
	}
	for i, m := range p.Metas {
		if m.Bad != "" || p.Verdicts[i] == Dropped {
			continue
		}
		for _, r := range m.Coverage {
			// A report counts for steps Seq..Upto (crossed at once).
			for seq := r.Seq; seq <= max(r.Upto, r.Seq); seq++ {
				if pending[[2]uint64{uint64(r.FlowID), seq}] {
					p.Reports = append(p.Reports, r)
					break
				}
			}
		}
	}
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
