package sink_test

import (
	"context"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// Verifying the flows of shared cycles reads each meta and chunk once and
// reports per flow: a shared chunk counts for every flow that holds it,
// and so does its damage.
func TestVerifyFlowsShared(t *testing.T) {
	const base = 1 << 40
	ctx := context.Background()
	mem := sink.NewMemBucket()
	evs := sharedEvents(base)
	m1, p1 := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "1-0-aa", ResolvedTS: base + 1, Flows: sharedFlows, Entries: evs[:len(evs)/2],
		Offsets: []sink.OffsetRange{{Topic: "apply", Partition: 0, From: 0, To: 10}}})
	m2, p2 := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "2-0-bb", ResolvedTS: base + 2, Flows: sharedFlows, Entries: evs[len(evs)/2:],
		Offsets: []sink.OffsetRange{{Topic: "apply", Partition: 0, From: 10, To: 20}}, Compression: sink.CompressionZstd})
	_, v1 := sinktest.WriteCycle(t, mem, sinktest.Cycle{Catalog: "default", Flow: "a", FlowID: 1, CycleID: "old", ResolvedTS: base,
		Entries: only(sharedEvents(base-1000), 1), Offsets: []sink.OffsetRange{{Topic: "apply", Partition: 1, From: 0, To: 5}}})
	opts := func() []sink.VerifyOptions {
		var out []sink.VerifyOptions
		for _, f := range sharedFlows {
			metas := []string{p1, p2}
			if f.FlowID == 1 {
				metas = append([]string{v1}, metas...)
			}
			out = append(out, sink.VerifyOptions{Flow: sink.Flow{Catalog: f.Catalog, Name: f.Name, ID: f.FlowID}, MetaPaths: metas})
		}
		return out
	}
	// held counts flow id's chunks in the v2 cycles and the data objects
	// holding them.
	held := func(id uint32) (chunks, objects int) {
		for _, m := range []sink.Meta{m1, m2} {
			n := 0
			for _, f := range m.Files {
				if m.Holds(id, &f) {
					n++
				}
			}
			if n > 0 {
				chunks, objects = chunks+n, objects+1
			}
		}
		return chunks, objects
	}
	v1Chunks := len(metaOf(t, mem, v1).Files)

	cb := newCountingBucket(mem)
	rs, err := sink.VerifyFlows(ctx, cb, opts(), 4)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		id := sharedFlows[i].FlowID
		want, objects := held(id)
		metas := 2
		if id == 1 {
			want, objects, metas = want+v1Chunks, objects+1, 3
		}
		if !r.OK() || r.Chunks != want || r.Metas != metas || r.DataObjects != objects {
			t.Errorf("flow %d: %+v, want OK with %d chunks in %d data objects of %d metas", id, r, want, objects, metas)
		}
	}
	if n := len(m1.Files) + len(m2.Files) + v1Chunks; cb.ranges != n {
		t.Errorf("%d ranged reads, want %d: each chunk once", cb.ranges, n)
	}
	for _, p := range []string{p1, p2, v1} {
		if cb.gets[p] != 1 {
			t.Errorf("meta %s read %d times, want once", p, cb.gets[p])
		}
	}

	// Damage a chunk of table 11, which flows 1 and 2 hold.
	i := 0
	for ; m1.Files[i].TableID != 11; i++ {
	}
	if !mem.Corrupt(m1.DataPath, m1.Files[i].Offset+3) {
		t.Fatal("corrupt")
	}
	if rs, err = sink.VerifyFlows(ctx, mem, opts(), 4); err != nil {
		t.Fatal(err)
	}
	for k, r := range rs {
		damaged := len(r.Faults) == 1 && strings.Contains(r.Faults[0], m1.DataPath)
		if id := sharedFlows[k].FlowID; damaged != (id != 3) || id == 3 && !r.OK() {
			t.Errorf("flow %d after damaging a chunk of flows 1 and 2: faults %q", id, r.Faults)
		}
	}

	// A listed meta that does not serve the flow is that flow's fault only.
	o := opts()
	o[2].MetaPaths = append(o[2].MetaPaths, v1)
	if rs, err = sink.VerifyFlows(ctx, mem, o, 4); err != nil {
		t.Fatal(err)
	}
	if len(rs[2].Faults) != 1 || !strings.Contains(rs[2].Faults[0], "refused") || len(rs[0].Faults) != 1 {
		t.Errorf("a v1 meta of flow 1 listed for flow 3: faults %q and %q", rs[2].Faults, rs[0].Faults)
	}
}
