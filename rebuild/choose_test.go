package rebuild

import (
	"reflect"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

func rng(p int32, from, to int64) sink.OffsetRange {
	return sink.OffsetRange{Topic: "a", Partition: p, From: from, To: to}
}

func TestChoose(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cands    [][]sink.OffsetRange
		verdicts []Verdict
		dups     []Duplicate
		gaps     []Gap
		ends     map[Partition]int64
	}{
		{"a chain", [][]sink.OffsetRange{{rng(0, 0, 10)}, {rng(0, 10, 20)}},
			[]Verdict{Chosen, Chosen}, nil, nil, map[Partition]int64{{"a", 0}: 20}},
		{"a zombie that froze later", [][]sink.OffsetRange{{rng(0, 0, 10)}, {rng(0, 0, 15)}, {rng(0, 10, 20)}},
			[]Verdict{Chosen, Dropped, Chosen}, nil, nil, map[Partition]int64{{"a", 0}: 20}},
		{"a zombie that froze earlier", [][]sink.OffsetRange{{rng(0, 0, 4)}, {rng(0, 0, 10)}, {rng(0, 10, 20)}},
			[]Verdict{Dropped, Chosen, Chosen}, nil, nil, map[Partition]int64{{"a", 0}: 20}},
		{"a crashed cycle consumed again alike", [][]sink.OffsetRange{{rng(0, 0, 10)}, {rng(0, 0, 10)}},
			[]Verdict{Chosen, Dropped}, nil, nil, map[Partition]int64{{"a", 0}: 10}},
		{"a cycle of two partitions and a zombie of one", [][]sink.OffsetRange{
			{rng(1, 0, 5)}, {rng(0, 0, 10), rng(1, 0, 5)}, {rng(0, 10, 20), rng(1, 5, 9)}},
			[]Verdict{Dropped, Chosen, Chosen}, nil, nil, map[Partition]int64{{"a", 0}: 20, {"a", 1}: 9}},
		{"an unavoidable overlap", [][]sink.OffsetRange{{rng(0, 0, 10), rng(1, 0, 10)}, {rng(1, 5, 15)}},
			[]Verdict{Chosen, Kept}, []Duplicate{{1, rng(1, 5, 10)}}, nil, map[Partition]int64{{"a", 0}: 10, {"a", 1}: 15}},
		{"a gap and an empty range", [][]sink.OffsetRange{{rng(0, 0, 10)}, {rng(0, 20, 30)}, {rng(0, 30, 30)}},
			[]Verdict{Chosen, Chosen, Chosen}, nil, []Gap{{rng(0, 10, 20)}}, map[Partition]int64{{"a", 0}: 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cands []Candidate
			for _, rs := range tc.cands {
				cands = append(cands, Candidate{Ranges: rs})
			}
			ch := Choose(cands)
			if !reflect.DeepEqual(ch.Verdicts, tc.verdicts) {
				t.Errorf("verdicts %v, want %v", ch.Verdicts, tc.verdicts)
			}
			if !reflect.DeepEqual(ch.Duplicates, tc.dups) {
				t.Errorf("duplicates %v, want %v", ch.Duplicates, tc.dups)
			}
			if !reflect.DeepEqual(ch.Gaps, tc.gaps) {
				t.Errorf("gaps %v, want %v", ch.Gaps, tc.gaps)
			}
			if !reflect.DeepEqual(ch.Ends, tc.ends) {
				t.Errorf("ends %v, want %v", ch.Ends, tc.ends)
			}
		})
	}
}
