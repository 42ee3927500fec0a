package replay

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flowlog/flowlog/sink"
)

func offs(rs ...sink.OffsetRange) []sink.OffsetRange { return rs }

func p(part int32, from, to int64) sink.OffsetRange {
	return sink.OffsetRange{Topic: "flowlog.apply", Partition: part, From: from, To: to}
}

// TestOrderCycles: cycles go in a topological order of every partition's
// offset chain, whatever the meta list's order; a cycle without records
// of partition 0 still goes between the cycles of partition 1 around it.
func TestOrderCycles(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cycles [][]sink.OffsetRange
		want   []int
		err    bool
	}{
		{"one partition, list order", [][]sink.OffsetRange{offs(p(0, 0, 5)), offs(p(0, 5, 9))}, []int{0, 1}, false},
		{"one partition, list out of order", [][]sink.OffsetRange{offs(p(0, 5, 9)), offs(p(0, 0, 5))}, []int{1, 0}, false},
		{"cycle without partition 0", [][]sink.OffsetRange{
			offs(p(0, 0, 5), p(1, 0, 3)), // c0
			offs(p(0, 5, 9), p(1, 6, 8)), // c1, listed before c2 but after it on partition 1
			offs(p(1, 3, 6)),             // c2: no records of partition 0
		}, []int{0, 2, 1}, false},
		{"unordered cycles keep list order", [][]sink.OffsetRange{offs(p(1, 0, 3)), offs(p(0, 0, 3)), offs()}, []int{0, 1, 2}, false},
		{"contradicting chains", [][]sink.OffsetRange{offs(p(0, 0, 5), p(1, 5, 9)), offs(p(0, 5, 9), p(1, 0, 5))}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := make([]cycle, len(tc.cycles))
			for i, o := range tc.cycles {
				cs[i] = cycle{index: i, offsets: o}
			}
			got, err := orderCycles(cs)
			if tc.err {
				if err == nil {
					t.Fatalf("orderCycles = %v, want an error", got)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("orderCycles = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestSortJobs: within a cycle a region's default-CF values go before its
// write-CF puts, then its deletes; regions in id order.
func TestSortJobs(t *testing.T) {
	mk := func(region uint64, cf, op string, index int) job {
		return job{index: index, f: sink.FileMeta{RegionID: region, CF: cf, Op: op, TableID: 1}}
	}
	js := []job{mk(2, sink.CFWrite, sink.OpPut, 0), mk(1, sink.CFWrite, sink.OpDelete, 1), mk(1, sink.CFWrite, sink.OpPut, 2),
		mk(1, sink.CFDefault, sink.OpPut, 3), mk(2, sink.CFDefault, sink.OpPut, 4)}
	sortJobs(js, true)
	var got []int
	for _, j := range js {
		got = append(got, j.index)
	}
	if want := []int{3, 2, 1, 4, 0}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestLinkRegions: a job's after is the lowest ts a later job of its
// region can send.
func TestLinkRegions(t *testing.T) {
	js := []job{
		{lo: 1, f: sink.FileMeta{RegionID: 1, MinTS: 10}},
		{lo: 1, f: sink.FileMeta{RegionID: 2, MinTS: 5}},
		{lo: 1, f: sink.FileMeta{RegionID: 1, MinTS: 30}},
		{lo: 1, f: sink.FileMeta{RegionID: 1, MinTS: 20}}, // a default-CF value prewritten earlier
	}
	linkRegions(js)
	for i, want := range []uint64{20, 0, 20, 0} {
		if js[i].after != want {
			t.Errorf("job %d: after %d, want %d", i, js[i].after, want)
		}
	}
}

// fakeClock advances only when slept on.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }
func (c *fakeClock) Sleep(_ context.Context, d time.Duration) error {
	c.now = c.now.Add(d)
	return nil
}

// TestLimiter: over any 10 s window the bytes sent stay within 10% of the
// rate, and a record larger than the burst goes out no sooner after the
// previous one than its size takes at the rate.
func TestLimiter(t *testing.T) {
	const rate = 1 << 20
	type sent struct {
		at time.Time
		n  int
	}
	send := func(sizes []int, count int) []sent {
		c := &fakeClock{now: time.Unix(1000, 0)}
		l := newLimiter(rate, c)
		var log []sent
		for i := range count {
			n := sizes[i%len(sizes)]
			if err := l.wait(context.Background(), n); err != nil {
				t.Fatal(err)
			}
			log = append(log, sent{c.now, n})
		}
		return log
	}
	log := send([]int{100, 64 << 10, 10, 500 << 10, 3000}, 2000)
	for i := range log {
		var sum int
		for j := i; j < len(log) && log[j].at.Sub(log[i].at) < 10*time.Second; j++ {
			sum += log[j].n
		}
		if float64(sum) > 1.1*rate*10 {
			t.Fatalf("%d bytes in the 10 s from record %d, rate %d/s", sum, i, rate)
		}
	}
	if secs := log[len(log)-1].at.Sub(log[0].at).Seconds(); secs < 10 {
		t.Fatalf("the test sent for %.1fs only", secs)
	}
	log = send([]int{100, 3 << 20, 200 << 10}, 50)
	for i := 1; i < len(log); i++ {
		if n := log[i].n; n > rate/2 {
			if gap := log[i].at.Sub(log[i-1].at); gap < time.Duration(float64(n)/rate*float64(time.Second))-time.Millisecond {
				t.Fatalf("record of %d bytes went out %v after the previous one, faster than the rate", n, gap)
			}
		}
	}
}

// TestSortJobsMultiRegion: a cycle with a chunk of several regions orders
// its chunks by class, table and position, so that every region's own
// chunks go in the order a cycle of per-region chunks gives them.
func TestSortJobsMultiRegion(t *testing.T) {
	mk := func(table int64, cf, op string, index int, multi bool) job {
		f := sink.FileMeta{RegionID: uint64(index), CF: cf, Op: op, TableID: table}
		if multi {
			f.RegionID, f.Regions = 0, []sink.RegionRun{{Region: 1, Entries: 1}, {Region: 2, Entries: 1}}
		}
		return job{index: index, f: f}
	}
	js := []job{mk(2, sink.CFWrite, sink.OpPut, 0, true), mk(1, sink.CFWrite, sink.OpDelete, 1, false), mk(1, sink.CFWrite, sink.OpPut, 2, true),
		mk(2, sink.CFDefault, sink.OpPut, 3, false), mk(1, sink.CFDefault, sink.OpPut, 4, true), mk(1, sink.CFWrite, sink.OpPut, 5, false)}
	sortJobs(js, false)
	var got []int
	for _, j := range js {
		got = append(got, j.index)
	}
	if want := []int{4, 3, 2, 5, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestLinkRegionsMultiRegion: a chunk of several regions has an after for
// each of them, and its min_ts bounds what each of them can send.
func TestLinkRegionsMultiRegion(t *testing.T) {
	runs := func(rs ...uint64) []sink.RegionRun {
		var out []sink.RegionRun
		for _, r := range rs {
			out = append(out, sink.RegionRun{Region: r, Entries: 1})
		}
		return out
	}
	js := []job{
		{lo: 1, f: sink.FileMeta{RegionID: 1, MinTS: 10}},
		{lo: 1, f: sink.FileMeta{Regions: runs(2, 1, 2), MinTS: 5}},
		{lo: 1, f: sink.FileMeta{RegionID: 2, MinTS: 30}},
		{lo: 1, f: sink.FileMeta{Regions: runs(3, 1), MinTS: 20}},
	}
	linkRegions(js)
	for _, tc := range []struct {
		job    int
		region uint64
		want   uint64
	}{
		{0, 1, 5}, {1, 1, 20}, {1, 2, 30}, {1, 9, 0}, {2, 2, 0}, {3, 1, 0}, {3, 3, 0},
	} {
		if got := js[tc.job].afterOf(tc.region); got != tc.want {
			t.Errorf("job %d, region %d: after %d, want %d", tc.job, tc.region, got, tc.want)
		}
	}
}
