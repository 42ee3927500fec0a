package sink_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// regionEvents are sharedEvents sent by three regions, interleaved, so that
// a chunk of every region of a key holds several runs.
func regionEvents(base uint64) []sinktest.Entry {
	evs := sharedEvents(base)
	for i := range evs {
		evs[i].RegionID = uint64(i/2%3) * 7 // 0 is a region id like any other
	}
	return evs
}

// A backup whose chunks hold every region of a key (layout v2, with region
// runs) restores and verifies as the same backup with a chunk per region.
func TestRestoreVerifyMultiRegionChunks(t *testing.T) {
	const base = 1 << 40
	ctx := context.Background()
	evs := regionEvents(base)
	write := func(multi bool) (*sink.MemBucket, []sink.Meta, []string) {
		mem := sink.NewMemBucket()
		m1, p1 := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "1-0-aa", ResolvedTS: base + 1, Flows: sharedFlows, Entries: evs[:len(evs)/2],
			Compression: sink.CompressionZstd, MultiRegion: multi})
		m2, p2 := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "2-0-bb", ResolvedTS: base + 2, Flows: sharedFlows, Entries: evs[len(evs)/2:],
			MultiRegion: multi})
		return mem, []sink.Meta{m1, m2}, []string{p1, p2}
	}
	narrow, narrowMetas, narrowPaths := write(false)
	wide, wideMetas, widePaths := write(true)

	files := func(ms []sink.Meta) (n, multi int) {
		for _, m := range ms {
			for _, f := range m.Files {
				n++
				if f.Regions != nil {
					multi++
				}
			}
		}
		return n, multi
	}
	nn, _ := files(narrowMetas)
	wn, wm := files(wideMetas)
	if wm == 0 || wn >= nn {
		t.Fatalf("the multi-region backup has %d chunks (%d of several regions), the narrow one %d: want fewer, some of several regions", wn, wm, nn)
	}

	for _, f := range sharedFlows {
		flow := sink.Flow{Catalog: f.Catalog, Name: f.Name, ID: f.FlowID}
		for _, ts := range []uint64{base + 1235, base + 1245, base + 2000} {
			want := restoreDir(t, narrow, flow, narrowPaths, ts)
			got := restoreDir(t, wide, flow, widePaths, ts)
			if fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
				t.Errorf("flow %d as of %d: restore of multi-region chunks\n%v\nwant\n%v", f.FlowID, ts, got, want)
			}
		}
	}

	verify := func(b sink.Bucket, paths []string) []sink.VerifyReport {
		var opts []sink.VerifyOptions
		for _, f := range sharedFlows {
			opts = append(opts, sink.VerifyOptions{Flow: sink.Flow{Catalog: f.Catalog, Name: f.Name, ID: f.FlowID}, MetaPaths: paths})
		}
		rs, err := sink.VerifyFlows(ctx, b, opts, 2)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	nr, wr := verify(narrow, narrowPaths), verify(wide, widePaths)
	for i := range wr {
		if !wr[i].OK() || !nr[i].OK() || wr[i].ChunkBytes != nr[i].ChunkBytes || wr[i].Metas != 2 {
			t.Errorf("flow %d: verify of multi-region chunks %+v, of per-region chunks %+v: want both OK over the same bytes", sharedFlows[i].FlowID, wr[i], nr[i])
		}
	}
}
