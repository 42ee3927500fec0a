package meta_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// The replica simulation at a small size, in every test run: four replicas
// commit concurrently through the real commit and advance path while a DDL
// adds a table and another member takes over one partition. Afterwards
// Redis holds exactly what was committed: every offset where its owner
// left it, one meta per flow per commit, a checkpoint no later than any
// partition's, the added table's window final, and the zombie's commit
// refused without a trace.
func TestReplicaLoad(t *testing.T) {
	ctx := context.Background()
	shape := simShape{Replicas: 4, Partitions: 16, Flows: 3, Regions: 2, Interval: 20 * time.Millisecond}
	sim := startSim(t, shape)
	if err := simDDL(ctx, sim.admin, 0, []uint32{1, 2, 99}, int64(shape.Flows+1)); err != nil {
		t.Fatalf("replace adding table 99: %v", err)
	}
	sim.ddls.Add(1)
	sim.rec.Store(true)

	zombie := sim.replicas[0]
	taken := false
	deadline := time.Now().Add(2 * time.Minute)
	sim.run(t, func() bool {
		if time.Now().After(deadline) {
			return true
		}
		sim.stats.mu.Lock()
		commits := sim.stats.commits
		sim.stats.mu.Unlock()
		if !taken && zombie.committed.Load() >= 2 {
			if _, err := sim.admin.AcquireLease(ctx, simTopic, zombie.parts[0].lease.Partition, "intruder"); err != nil {
				t.Errorf("take over: %v", err)
			}
			taken = true
		}
		pending, err := sim.admin.PendingCoverage(ctx)
		return err == nil && len(pending) == 0 && commits >= 40 && zombieStopped(sim)
	})
	if time.Now().After(deadline) {
		t.Fatalf("after 2 minutes: %d commits, zombie stopped %v", sim.stats.commits, zombieStopped(sim))
	}

	if len(sim.stats.errs) != 1 || !errors.Is(sim.stats.errs[0], meta.ErrLeaseLost) {
		t.Fatalf("errors = %v, want the zombie's lost lease alone", sim.stats.errs)
	}
	for _, rep := range sim.replicas {
		for _, p := range rep.parts {
			off, ok, err := sim.admin.Offset(ctx, simTopic, p.lease.Partition)
			if err != nil || !ok || off != p.stored || off <= 0 {
				t.Errorf("offset of partition %d = %d %v %v, want %d as replica %d left it", p.lease.Partition, off, ok, err, p.stored, rep.id)
			}
		}
	}
	all := make([]int32, shape.Partitions)
	for i := range all {
		all[i] = int32(i)
	}
	cks, _, err := sim.admin.PartitionCheckpoints(ctx, simTopic, all)
	if err != nil || len(cks) != shape.Partitions {
		t.Fatalf("partition checkpoints = %v, %v", cks, err)
	}
	minCk := cks[0]
	for _, ck := range cks {
		minCk = min(minCk, ck)
	}
	for _, f := range zombie.reg.Flows() {
		metas, err := sim.admin.Metas(ctx, f.ID)
		if err != nil || len(metas) != sim.stats.commits {
			t.Errorf("flow %d: %d metas (%v), want one per commit: %d", f.ID, len(metas), err, sim.stats.commits)
		}
		st, err := sim.admin.FlowState(ctx, f.ID)
		if err != nil || st.CheckpointTS == 0 || st.CheckpointTS > minCk {
			t.Errorf("flow %d checkpoint = %d (%v), want in (0, %d]", f.ID, st.CheckpointTS, err, minCk)
		}
	}
	cur, _, err := sim.admin.Windows(ctx, zombie.reg.Flows()[0].ID)
	if w, ok := cur[99]; err != nil || !ok || w.Since == 0 || w.Until != nil {
		t.Errorf("window of the added table = %+v %v (%v), want a final open window", w, ok, err)
	}
}

// zombieStopped reports whether replica 0 ended on its refused commit.
func zombieStopped(sim *simRun) bool {
	sim.stats.mu.Lock()
	defer sim.stats.mu.Unlock()
	return len(sim.stats.errs) > 0
}
