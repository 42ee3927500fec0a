package meta_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// Every key carries the {flowlog} hash tag, so the WATCH/MULTI transactions
// run unchanged through a Redis Cluster client.
func TestStoreOnRedisCluster(t *testing.T) {
	r := testenv.StartRedisCluster(t)
	cfg := meta.Config{URL: r.URL, Prefix: "flowlog", Cluster: true}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rdb, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	s := meta.NewStore(rdb, "flowlog", nil)
	d, err := meta.ParseDDL([]byte(`{"op":"create","flow":{"catalog_name":"default","flow_name":"c1","source_table_ids":[5,6]}}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.ApplyDDL(ctx, d, meta.DDLPosition{Topic: "ddl", Partition: 0, NextOffset: 1})
	if err != nil || !res.Changed {
		t.Fatalf("ApplyDDL on cluster = %+v, %v", res, err)
	}
	lease, err := s.AcquireLease(ctx, "apply", 0, "m1")
	if err != nil {
		t.Fatal(err)
	}
	// The advance turn is a write-only transaction: on a cluster it must
	// not WATCH nothing, claimed prefix or not.
	if ok, err := s.TakeAdvanceTurn(ctx, "m1", time.Minute); err != nil || !ok {
		t.Fatalf("TakeAdvanceTurn on cluster = %v, %v; want the free turn", ok, err)
	}
	err = s.Commit(ctx, meta.Commit{
		Leases:     []meta.Lease{lease},
		Partitions: []meta.PartitionCommit{{Topic: "apply", Partition: 0, NextOffset: 42, Checkpoint: 7, HasCheckpoint: true}},
		Metas:      []meta.MetaRef{{FlowID: res.FlowID, Path: "p/m.meta", MinResolvedTS: 7}},
	})
	if err != nil {
		t.Fatalf("Commit on cluster: %v", err)
	}
	if off, ok, err := s.Offset(ctx, "apply", 0); err != nil || !ok || off != 42 {
		t.Fatalf("offset = %d %v %v, want 42", off, ok, err)
	}
	tf, err := s.TableFlows(ctx, 6)
	if err != nil || len(tf) != 1 || tf[0].FlowID != res.FlowID {
		t.Fatalf("TableFlows(6) = %+v, %v", tf, err)
	}
}
