package meta_test

import (
	"context"
	"fmt"
	"log"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowlog/flowlog/meta"
)

// ExampleStore_CreateFlow creates a flow with two partitions on two
// flownodes over tables 1024 and 1025, then finds it through the table
// index the router reads. It needs a Redis at meta.DefaultURL, so it is not
// run as a test.
func ExampleStore_CreateFlow() {
	ctx := context.Background()
	cfg := meta.Config{URL: meta.DefaultURL, Prefix: meta.DefaultPrefix}
	rdb, err := cfg.NewClient()
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	store := meta.NewStore(rdb, cfg.Prefix, prometheus.NewRegistry())

	info := meta.FlowInfo{
		CatalogName:    "default",
		FlowName:       "orders",
		SourceTableIDs: []uint32{1024, 1025},
		FlownodeIDs:    map[uint32]uint64{0: 1, 1: 2},
	}
	routes := map[uint32]meta.Route{
		0: {Peer: meta.Peer{ID: 1, Addr: "flownode-1:4004"}},
		1: {Peer: meta.Peer{ID: 2, Addr: "flownode-2:4004"}},
	}
	if err := store.CreateFlow(ctx, 42, info, routes); err != nil {
		log.Fatal(err)
	}
	flows, err := store.TableFlows(ctx, 1024)
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range flows {
		fmt.Printf("table 1024 -> flow %d partition %d on flownode %d\n", f.FlowID, f.PartitionID, f.FlownodeID)
	}
}
