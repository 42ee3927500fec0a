package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// A table removed, added and removed again while this replica's registry
// lags Redis (every refresh finds Redis a DDL further on, so no report goes
// out in between) gets each removal's own boundary: the first window ends
// at the partition's checkpoint when it stopped routing the table the first
// time, not the second.
func TestCoverageBoundaryPerEntryWhileRegistryLags(t *testing.T) {
	ctx := context.Background()
	st := meta.NewStore(testenv.StartRedis(t).Client(t), "", nil)
	reg := meta.NewRegistry(st)
	c := &Consumer{cfg: Config{RegionTTL: time.Hour}, d: Deps{ApplyTopic: "apply", Store: st, Registry: reg},
		log: slog.New(slog.DiscardHandler), m: newMetrics(nil)}
	c.fatal = newFatal(st, reg, c.m, c.log, 30)
	s := &session{c: c, parts: map[int32]*partState{}}
	s.fl = newFlusher(c)
	lease, err := st.AcquireLease(ctx, "apply", 0, "m")
	if err != nil {
		t.Fatal(err)
	}
	ps := &partState{partition: 0, lease: lease, next: 10, regions: map[uint64]*regionState{},
		cov: newPartCoverage(meta.PartitionStart{})}
	s.parts[0] = ps
	at := func(resolved, maxTS uint64) { // the partition's position
		ps.regions[1] = &regionState{resolved: resolved, seen: time.Now()}
		ps.maxTS = maxTS
	}
	offset := int64(0)
	ddl := func(op string, tables ...uint32) {
		t.Helper()
		offset++
		d := meta.DDL{Op: op, Flow: meta.FlowInfo{FlowName: "f", SourceTableIDs: tables}}
		if _, err := st.ApplyDDL(ctx, d, meta.DDLPosition{Topic: "ddl", NextOffset: offset}); err != nil {
			t.Fatalf("%s %v: %v", op, tables, err)
		}
	}
	observe := func() {
		t.Helper()
		if err := reg.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		s.observeFlows()
	}

	ddl("create", 1, 2)
	observe() // the session's first view
	s.collectCoverage(ctx)

	at(100, 150)
	ddl("replace", 1) // table 2 removed: until at checkpoint 100
	observe()
	ddl("replace", 1, 2) // Redis moves on before this replica reports
	s.collectCoverage(ctx)

	at(200, 250)
	observe() // table 2 added again: since at max ts 250
	ddl("replace", 1)
	s.collectCoverage(ctx)

	at(300, 350)
	observe() // table 2 removed again: until at checkpoint 300
	s.collectCoverage(ctx)

	if err := st.Commit(ctx, meta.Commit{Leases: []meta.Lease{lease}, Coverage: ps.cov.reports}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinalizeCoverage(ctx, "apply", []int32{0}); err != nil {
		t.Fatal(err)
	}
	id, _, err := st.FlowIDByName(ctx, meta.DefaultCatalog, "f")
	if err != nil {
		t.Fatal(err)
	}
	cur, hist, err := st.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || hist[0].TableID != 2 || hist[0].Since != 0 || hist[0].Until == nil || *hist[0].Until != 100 {
		t.Errorf("history = %s, want table 2's first window [0, 100]", windowsString(hist))
	}
	if w := cur[2]; w.Since != 250 || w.Until == nil || *w.Until != 300 {
		t.Errorf("table 2's current window = %s, want [250, 300]", windowsString([]meta.Window{w}))
	}
	if w := cur[1]; w.Since != 0 || w.Until != nil {
		t.Errorf("table 1's window = %s, want [0, open)", windowsString([]meta.Window{w}))
	}
}

func windowsString(ws []meta.Window) string {
	out := ""
	for _, w := range ws {
		until := "open"
		if w.Until != nil {
			until = fmt.Sprint(*w.Until)
		}
		out += fmt.Sprintf("table %d [%d, %s] ", w.TableID, w.Since, until)
	}
	return out
}
