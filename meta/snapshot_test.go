package meta_test

import (
	"context"
	"errors"
	"testing"

	"github.com/flowlog/flowlog/meta"
)

func TestSnapshotListing(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	const id = meta.FlowID(7)
	a := "p/default/f/v1/snapshot/00000000000000000900-7/snapshot.meta"
	b := "p/default/f/v1/snapshot/18446744073709551000-7/snapshot.meta"
	c := "p/default/f/v1/snapshot/18446744073709550999-7/snapshot.meta"
	for _, p := range []string{b, a, c, a} {
		if err := s.AddSnapshot(ctx, id, p); err != nil {
			t.Fatalf("AddSnapshot(%s): %v", p, err)
		}
	}
	got, err := s.Snapshots(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{900, 18446744073709550999, 18446744073709551000}
	if len(got) != len(want) {
		t.Fatalf("Snapshots = %+v, want ts %v", got, want)
	}
	for i, r := range got {
		if r.TS != want[i] || r.FlowID != id {
			t.Errorf("Snapshots[%d] = %+v, want ts %d", i, r, want[i])
		}
	}
	if err := s.AddSnapshot(ctx, 8, a); !errors.Is(err, meta.ErrBadSnapshotPath) {
		t.Errorf("AddSnapshot of another flow id's path: %v, want ErrBadSnapshotPath", err)
	}
	if err := s.AddSnapshot(ctx, id, "p/default/f/v1/snapshot/900-7/snapshot.meta"); !errors.Is(err, meta.ErrBadSnapshotPath) {
		t.Errorf("AddSnapshot of an unpadded path: %v, want ErrBadSnapshotPath", err)
	}
	if _, ok, err := s.TruncatedBefore(ctx, id); err != nil || ok {
		t.Errorf("TruncatedBefore of a flow never truncated = %v, %v", ok, err)
	}
	if err := s.Client().Set(ctx, s.Keys().TruncatedBefore(uint32(id)), "900", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if ts, ok, err := s.TruncatedBefore(ctx, id); err != nil || !ok || ts != 900 {
		t.Errorf("TruncatedBefore = %d, %v, %v; want 900", ts, ok, err)
	}
}
