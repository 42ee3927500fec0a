package replay

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"slices"

	"github.com/flowlog/flowlog/sink"
)

// cycle is one meta of the flow: a flush cycle, with the offsets of every
// apply partition it consumed and the jobs of its chunks.
type cycle struct {
	index   int // in the flow's meta list (resolved-ts order)
	path    string
	offsets []sink.OffsetRange
	jobs    []job
	early   []job // default-CF chunks that may hold values of puts in range prewritten at or before From
}

// job is one chunk to replay, and the ts range of its entries that are
// sent: lo <= ts <= hi. An early job sends only the entries the needed set
// names.
type job struct {
	dataPath string
	index    int
	f        sink.FileMeta
	lo, hi   uint64
	since    uint64 // the table's window start
	early    bool
	// after is the lowest ts an entry of a later job of the same region
	// can have, 0 if the region has none: the region's resolved ts after
	// this job stays below it. A chunk of several regions (f.Regions) has
	// one for each of its regions in afters instead, by region.
	after  uint64
	afters []regionAfter
}

// regionAfter is the after of one region of a multi-region job.
type regionAfter struct {
	region, after uint64
}

// multi reports whether the job's chunk holds several regions' entries,
// in the runs f.Regions lists.
func (j *job) multi() bool { return j.f.Regions != nil }

// afterOf is the job's after for one of its regions.
func (j *job) afterOf(region uint64) uint64 {
	if !j.multi() {
		return j.after
	}
	i, ok := slices.BinarySearchFunc(j.afters, region, func(a regionAfter, r uint64) int { return cmp.Compare(a.region, r) })
	if !ok {
		return 0
	}
	return j.afters[i].after
}

// regions are the distinct regions of the job, ascending.
func (j *job) regions() []uint64 {
	if !j.multi() {
		return []uint64{j.f.RegionID}
	}
	rs := make([]uint64, 0, len(j.f.Regions))
	for _, r := range j.f.Regions {
		rs = append(rs, r.Region)
	}
	slices.Sort(rs)
	return slices.Compact(rs)
}

// class orders a cycle's chunks of one region: default-CF values first, so
// that the write-CF puts that need them come after them; then the write-CF
// puts, then the deletes (which TiKV emits only for versions it garbage
// collected).
func (j *job) class() int {
	switch {
	case j.f.CF == sink.CFDefault && j.f.Op == sink.OpPut:
		return 0
	case j.f.CF == sink.CFWrite && j.f.Op == sink.OpPut:
		return 1
	case j.f.CF == sink.CFWrite:
		return 2
	}
	return 3
}

// effLo is the lowest ts an entry the job sends can have.
func (j *job) effLo() uint64 { return max(j.f.MinTS, j.lo) }

// readCycles streams the flow's metas in list order and keeps, of each,
// its offsets and the chunks pick chooses (with a prefix of their keys if
// keys is set).
func readCycles(ctx context.Context, b sink.Bucket, f sink.Flow, paths []string, keys bool, pick func(dataPath string, i int, fm *sink.FileMeta) (job, bool, job, bool)) ([]cycle, error) {
	cycles := make([]cycle, len(paths))
	for k, p := range paths {
		c := &cycles[k]
		c.index, c.path = k, p
		err := sink.StreamFlowMeta(ctx, b, f, p, keys, func(m *sink.Meta) error {
			c.offsets = slices.Clone(m.Offsets)
			return nil
		}, func(m *sink.Meta, i int, fm *sink.FileMeta) error {
			j, ok, e, early := pick(m.DataPath, i, fm)
			if early {
				c.early = append(c.early, e)
			}
			if ok {
				c.jobs = append(c.jobs, j)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		byRegion := !slices.ContainsFunc(c.jobs, func(j job) bool { return j.multi() }) &&
			!slices.ContainsFunc(c.early, func(j job) bool { return j.multi() })
		sortJobs(c.jobs, byRegion)
		sortJobs(c.early, byRegion)
	}
	return cycles, nil
}

// sortJobs puts a cycle's jobs in replay order: by class, then table, then
// position in the meta, so that each region's chunks go in that order.
// With byRegion, which a cycle of chunks of one region each takes, the
// region goes first: the order replays had before chunks held several
// regions, kept so that a replay of such a backup writes what it wrote
// then, record for record. A multi-region chunk cannot be placed by one
// region; every region's own sequence of chunks is the same either way.
func sortJobs(js []job, byRegion bool) {
	slices.SortStableFunc(js, func(a, b job) int {
		c := 0
		if byRegion {
			c = cmp.Compare(a.f.RegionID, b.f.RegionID)
		}
		return cmp.Or(c, cmp.Compare(a.class(), b.class()),
			cmp.Compare(a.f.TableID, b.f.TableID), cmp.Compare(a.index, b.index))
	})
}

// orderCycles returns the cycles' indexes in a topological order of every
// apply partition's offset chain: a cycle that consumed a partition's
// offsets before another cycle did comes first, for every partition. A
// region's records are in one partition at a time, so its events keep the
// order in which they were consumed, even across a cycle that holds no
// records of some partition (which says nothing of that partition's
// order). Cycles the chains do not order keep the meta list's order (by
// min resolved ts). Chains that contradict each other (overlapping or
// crossing offset ranges) fail: the metas do not describe one consumption.
func orderCycles(cycles []cycle) ([]int, error) {
	type part struct {
		topic string
		p     int32
	}
	type at struct {
		from int64
		c    int
	}
	chains := map[part][]at{}
	for i, c := range cycles {
		for _, o := range c.offsets {
			k := part{o.Topic, o.Partition}
			chains[k] = append(chains[k], at{o.From, i})
		}
	}
	succ := make([][]int, len(cycles))
	indeg := make([]int, len(cycles))
	for _, ch := range chains {
		slices.SortFunc(ch, func(a, b at) int { return cmp.Or(cmp.Compare(a.from, b.from), cmp.Compare(a.c, b.c)) })
		for k := 1; k < len(ch); k++ {
			a, b := ch[k-1].c, ch[k].c
			if a == b {
				continue
			}
			succ[a] = append(succ[a], b)
			indeg[b]++
		}
	}
	h := &intHeap{}
	for i := range cycles {
		if indeg[i] == 0 {
			heap.Push(h, i)
		}
	}
	order := make([]int, 0, len(cycles))
	for h.Len() > 0 {
		i := heap.Pop(h).(int)
		order = append(order, i)
		for _, s := range succ[i] {
			if indeg[s]--; indeg[s] == 0 {
				heap.Push(h, s)
			}
		}
	}
	if len(order) != len(cycles) {
		return nil, fmt.Errorf("the metas' offset ranges contradict each other: %d of %d metas cannot be ordered", len(cycles)-len(order), len(cycles))
	}
	return order, nil
}

type intHeap []int

func (h intHeap) Len() int           { return len(h) }
func (h intHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h intHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *intHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *intHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// linkRegions sets every job's after (of a multi-region job, the after of
// each of its regions): the lowest ts a later job of the region can send.
// A multi-region chunk's min_ts bounds the entries of each of its regions.
func linkRegions(jobs []job) {
	next := map[uint64]uint64{}
	for i := len(jobs) - 1; i >= 0; i-- {
		j := &jobs[i]
		regions := j.regions()
		if j.multi() {
			j.afters = make([]regionAfter, len(regions))
			for k, r := range regions {
				j.afters[k] = regionAfter{region: r, after: next[r]}
			}
		} else {
			j.after = next[j.f.RegionID]
		}
		lo := j.effLo()
		for _, r := range regions {
			if cur, ok := next[r]; !ok || lo < cur {
				next[r] = lo
			}
		}
	}
}
