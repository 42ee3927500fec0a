package pipeline

import "testing"

// A cycle frozen by size counts as reading a backlog only when at least as
// many records again still wait: heavy steady traffic, which freezes by
// size with little waiting, must keep its full-size objects.
func TestTrackBacklog(t *testing.T) {
	part := func(cycleFrom, next, hwm int64) *partState {
		return &partState{cycleFrom: cycleFrom, next: next, hwm: hwm}
	}
	cases := []struct {
		name    string
		parts   []*partState
		trigger string
		before  bool
		want    bool
	}{
		{"size, a full cycle still waits", []*partState{part(0, 100, 200), part(0, 100, 200)}, triggerSize, false, true},
		{"files, a full cycle still waits", []*partState{part(0, 100, 200)}, triggerFiles, false, true},
		{"size, steady traffic", []*partState{part(0, 100, 130), part(50, 100, 110)}, triggerSize, false, false},
		{"size, last cycle of a backlog keeps the flag", []*partState{part(0, 100, 110)}, triggerSize, true, true},
		{"interval ends it", []*partState{part(0, 100, 500)}, triggerInterval, true, false},
		{"caught up ends it", []*partState{part(0, 100, 100)}, triggerCaughtUp, true, false},
		{"ddl keeps it", []*partState{part(0, 100, 100)}, triggerDDL, true, true},
		{"no record yet", []*partState{part(-1, -1, 500)}, triggerSize, false, false},
	}
	for _, tc := range cases {
		s := &session{parts: map[int32]*partState{}, behind: tc.before}
		for i, ps := range tc.parts {
			s.parts[int32(i)] = ps
		}
		s.trackBacklog(tc.trigger)
		if s.behind != tc.want {
			t.Errorf("%s: behind = %v, want %v", tc.name, s.behind, tc.want)
		}
	}
}

func TestDrained(t *testing.T) {
	s := &session{parts: map[int32]*partState{
		0: {next: 10, hwm: 10},
		1: {next: -1, hwm: 7}, // no record handled yet: nothing of it is known to wait
		2: {next: 5, hwm: 0},  // never fetched
	}}
	if !s.drained() {
		t.Fatal("drained = false with every partition at its high watermark")
	}
	s.parts[3] = &partState{next: 4, hwm: 9}
	if s.drained() {
		t.Fatal("drained = true with 5 records waiting on partition 3")
	}
}

// A generation whose raw runs fill --max-temp-bytes below --flush-size is
// frozen by size: fetching pauses at that budget, and with nothing in
// flight to free it only a freeze lets the consumer go on.
func TestSizeReached(t *testing.T) {
	cases := []struct {
		name            string
		bytes, mem, raw int64
		want            bool
	}{
		{"empty", 0, 0, 0, false},
		{"under both", 300, 200, 100, false},
		{"flush size by bytes and memory", 600, 424, 0, true},
		{"temp budget by raw runs, below flush size", 500, 300, 248, true},
		{"raw runs just under the budget", 500, 300, 247, false},
	}
	for _, tc := range cases {
		s := &session{
			c:   &Consumer{cfg: Config{FlushSize: 1024, MaxTempBytes: 1048}},
			gen: &generation{bytes: tc.bytes, mem: tc.mem, raw: tc.raw},
		}
		if got := s.sizeReached(); got != tc.want {
			t.Errorf("%s: sizeReached = %v, want %v (cost %d, disk cost %d)", tc.name, got, tc.want,
				s.gen.cost(), s.gen.diskCost())
		}
	}
}
