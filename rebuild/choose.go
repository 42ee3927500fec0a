package rebuild

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"

	"github.com/flowlog/flowlog/sink"
)

// Choosing the metas (docs/OPERATING.md, "Losing Redis"). The bucket holds
// the metas of every committed cycle, and also those no commit listed: a
// fenced zombie's cycle and a cycle whose consumer crashed between upload
// and commit. Both overlap the committed ones: the records they hold were
// consumed again, from the same offset, by the next cycle that committed.
// Per apply partition the committed cycles form a chain of offset ranges
// that tile what was consumed, so the choice is the set of metas that
// covers the most offsets of every partition without overlap:
//
//   - per partition, a weighted interval scheduling picks the ranges that
//     cover the most offsets without overlap, ties going to metas picked on
//     their other partitions, then to fewer metas; a few rounds let a meta
//     of several partitions be picked on all of them;
//   - a meta picked on none of its partitions is dropped when every offset
//     it holds is held by the picked metas (a zombie's or crashed cycle's);
//     one that holds an offset nothing else holds is kept, and so is a meta
//     picked on some of its partitions only: dropping it would lose events,
//     keeping it duplicates those of its offsets others hold too. Such
//     duplicates are the ones the choice cannot avoid; they are counted
//     and explained, and restore's MVCC read takes each (key, ts) once.

// Candidate is a meta as the choice sees it: the offset ranges it holds.
type Candidate struct {
	Path   string
	Ranges []sink.OffsetRange
}

// Verdict is what the choice made of a candidate.
type Verdict int

// Verdicts.
const (
	// Chosen: picked on every partition it holds offsets of.
	Chosen Verdict = iota
	// Dropped: every offset it holds is held by chosen metas.
	Dropped
	// Kept: needed (it alone holds some offsets, or it was picked on some
	// of its partitions) although others hold some of its offsets too.
	Kept
)

// Duplicate is a range of one partition held by a kept meta and by
// another chosen or kept meta as well: its records' events are stored
// twice in what the metas list.
type Duplicate struct {
	Candidate int // index in the candidates
	sink.OffsetRange
}

// Gap is a range of a partition between chosen ranges that no meta holds:
// cycles with neither chunks nor coverage reports upload no meta, so a
// gap is normal where records routed to no flow.
type Gap struct{ sink.OffsetRange }

// Choice is the outcome of Choose.
type Choice struct {
	Verdicts   []Verdict // per candidate
	Duplicates []Duplicate
	Gaps       []Gap
	// Ends is, per partition, the end of the highest chosen range.
	Ends map[Partition]int64
}

// Partition names an apply partition.
type Partition struct {
	Topic     string
	Partition int32
}

func (p Partition) String() string { return fmt.Sprintf("%s/%d", p.Topic, p.Partition) }

type interval struct {
	cand     int
	from, to int64
}

// weight orders interval sets: more offsets covered, then more metas
// picked on other partitions, then fewer metas.
type weight struct {
	cover int64
	bonus int
	n     int
}

func (a weight) less(b weight) bool {
	if a.cover != b.cover {
		return a.cover < b.cover
	}
	if a.bonus != b.bonus {
		return a.bonus < b.bonus
	}
	return a.n > b.n
}

func (a weight) plus(iv interval, bonus int) weight {
	return weight{cover: a.cover + iv.to - iv.from, bonus: a.bonus + bonus, n: a.n + 1}
}

// Choose picks the metas of cands (see the comment above).
func Choose(cands []Candidate) Choice {
	parts := map[Partition][]interval{}
	for i, c := range cands {
		for _, r := range c.Ranges {
			if r.To > r.From {
				p := Partition{r.Topic, r.Partition}
				parts[p] = append(parts[p], interval{cand: i, from: r.From, to: r.To})
			}
		}
	}
	keys := make([]Partition, 0, len(parts))
	for p := range parts {
		keys = append(keys, p)
	}
	slices.SortFunc(keys, func(a, b Partition) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	picked := map[Partition]map[int]bool{}
	count := make([]int, len(cands)) // partitions a candidate was picked on, last round
	for range 4 {
		next := map[Partition]map[int]bool{}
		for _, p := range keys {
			// The bonus of a candidate on p: the other partitions it was
			// picked on.
			bonus := func(c int) int {
				if picked[p][c] {
					return count[c] - 1
				}
				return count[c]
			}
			next[p] = schedule(parts[p], bonus)
		}
		nc := make([]int, len(cands))
		for _, set := range next {
			for c := range set {
				nc[c]++
			}
		}
		same := reflect.DeepEqual(next, picked)
		picked, count = next, nc
		if same {
			break
		}
	}

	ch := Choice{Verdicts: make([]Verdict, len(cands)), Ends: map[Partition]int64{}}
	in := make([]bool, len(cands)) // chosen or kept
	for i, c := range cands {
		n, on := 0, 0
		for _, r := range c.Ranges {
			if r.To > r.From {
				n++
				if picked[Partition{r.Topic, r.Partition}][i] {
					on++
				}
			}
		}
		switch {
		case on == n:
			ch.Verdicts[i], in[i] = Chosen, true
		case on > 0:
			ch.Verdicts[i], in[i] = Kept, true
		default:
			ch.Verdicts[i] = Dropped
		}
	}
	// A dropped meta that holds offsets nothing in holds is kept after all;
	// keeping one may cover what made another one needed, so go in order.
	for changed := true; changed; {
		changed = false
		for i := range cands {
			if in[i] {
				continue
			}
			for _, r := range cands[i].Ranges {
				if r.To > r.From && len(uncovered(parts[Partition{r.Topic, r.Partition}], in, r.From, r.To, -1)) > 0 {
					ch.Verdicts[i], in[i], changed = Kept, true, true
					break
				}
			}
		}
	}
	for _, p := range keys {
		ivs := parts[p]
		for _, iv := range ivs {
			if !in[iv.cand] || ch.Verdicts[iv.cand] != Kept {
				continue
			}
			for _, o := range overlaps(ivs, in, iv) {
				ch.Duplicates = append(ch.Duplicates, Duplicate{Candidate: iv.cand,
					OffsetRange: sink.OffsetRange{Topic: p.Topic, Partition: p.Partition, From: o[0], To: o[1]}})
			}
		}
		lo, hi := int64(-1), int64(-1)
		for _, iv := range ivs {
			if in[iv.cand] {
				if lo < 0 || iv.from < lo {
					lo = iv.from
				}
				hi = max(hi, iv.to)
			}
		}
		if hi >= 0 {
			ch.Ends[p] = hi
			for _, g := range uncovered(ivs, in, lo, hi, -1) {
				ch.Gaps = append(ch.Gaps, Gap{sink.OffsetRange{Topic: p.Topic, Partition: p.Partition, From: g[0], To: g[1]}})
			}
		}
	}
	return ch
}

// schedule is a weighted interval scheduling of ivs: the set of candidates
// whose intervals do not overlap and weigh the most.
func schedule(ivs []interval, bonus func(cand int) int) map[int]bool {
	s := slices.Clone(ivs)
	slices.SortFunc(s, func(a, b interval) int {
		return cmp.Or(cmp.Compare(a.to, b.to), cmp.Compare(a.from, b.from), cmp.Compare(a.cand, b.cand))
	})
	best := make([]weight, len(s)+1)
	take := make([]bool, len(s)+1)
	prev := make([]int, len(s)+1)
	for i := 1; i <= len(s); i++ {
		iv := s[i-1]
		// The intervals ending at or before iv starts: a prefix of s.
		j, _ := slices.BinarySearchFunc(s[:i-1], iv.from+1, func(x interval, t int64) int { return cmp.Compare(x.to, t) })
		with := best[j].plus(iv, bonus(iv.cand))
		best[i], prev[i] = best[i-1], i-1
		if best[i-1].less(with) {
			best[i], take[i], prev[i] = with, true, j
		}
	}
	out := map[int]bool{}
	for i := len(s); i > 0; i = prev[i] {
		if take[i] {
			out[s[i-1].cand] = true
		}
	}
	return out
}

// uncovered returns the parts of [from, to) that no interval of a
// candidate in holds, skipping candidate skip.
func uncovered(ivs []interval, in []bool, from, to int64, skip int) [][2]int64 {
	var cov [][2]int64
	for _, iv := range ivs {
		if in[iv.cand] && iv.cand != skip && iv.to > from && iv.from < to {
			cov = append(cov, [2]int64{max(iv.from, from), min(iv.to, to)})
		}
	}
	slices.SortFunc(cov, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var out [][2]int64
	at := from
	for _, c := range cov {
		if c[0] > at {
			out = append(out, [2]int64{at, c[0]})
		}
		at = max(at, c[1])
	}
	if at < to {
		out = append(out, [2]int64{at, to})
	}
	return out
}

// overlaps returns the parts of iv that other candidates in hold too.
func overlaps(ivs []interval, in []bool, iv interval) [][2]int64 {
	free := uncovered(ivs, in, iv.from, iv.to, iv.cand)
	var out [][2]int64
	at := iv.from
	for _, f := range free {
		if f[0] > at {
			out = append(out, [2]int64{at, f[0]})
		}
		at = f[1]
	}
	if at < iv.to {
		out = append(out, [2]int64{at, iv.to})
	}
	return out
}
