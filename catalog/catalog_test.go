package catalog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// newest returns the highest revision of flow id's catalog in the bucket,
// passing over objects that are no catalog.
func newest(t *testing.T, b sink.Bucket, name string, id meta.FlowID) (sink.Catalog, bool) {
	t.Helper()
	ctx := context.Background()
	var best sink.Catalog
	found := false
	err := b.Iter(ctx, sink.CatalogDir("pre", meta.DefaultCatalog, name), func(o string) error {
		rc, err := b.Get(ctx, o)
		if err != nil {
			return err
		}
		raw, _ := io.ReadAll(rc)
		rc.Close()
		c, err := sink.DecodeCatalog(raw)
		if err != nil {
			return nil
		}
		if c.FlowID == id && (!found || c.Rev > best.Rev) {
			best, found = c, true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return best, found
}

// sameContent compares two catalogs but for the checkpoint they read.
func sameContent(a, b sink.Catalog) bool {
	a.CheckpointTS, b.CheckpointTS = 0, 0
	x, _ := sink.EncodeCatalog(a)
	y, _ := sink.EncodeCatalog(b)
	return bytes.Equal(x, y)
}

// Two replicas write the dirty catalogs over and over while flows change
// under them: every change reaches the bucket (the highest revision of each
// flow's catalog is its content as Redis holds it at the end), the flows
// end clean, and no writer takes the other's upload of a revision for a
// foreign object.
func TestDirtyCatalogsUnderTwoReplicas(t *testing.T) {
	ctx := context.Background()
	rs := testenv.StartRedis(t)
	bucket := sink.NewMemBucket()
	changer := meta.NewStore(rs.Client(t), "", nil)
	next := int64(0)
	apply := func(op, name string, tables ...uint32) meta.FlowID {
		t.Helper()
		next++
		a, err := changer.ApplyDDL(ctx, meta.DDL{Op: op, Flow: meta.FlowInfo{FlowName: name, SourceTableIDs: tables}},
			meta.DDLPosition{Topic: "ddl", NextOffset: next})
		if err != nil {
			t.Fatal(err)
		}
		return a.FlowID
	}
	a, b, gone := apply("create", "a", 1), apply("create", "b", 2), apply("create", "gone", 3)

	writers := make([]*Writer, 2)
	for i := range writers {
		writers[i] = &Writer{Store: meta.NewStore(rs.Client(t), "", nil), Bucket: bucket, Prefix: "pre", Group: "g", Parallel: 2}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, w := range writers {
		wg.Go(func() {
			for {
				if _, err := w.WriteDirty(ctx); err != nil && !errors.Is(err, meta.ErrConflict) {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	for i := range 40 {
		apply("replace", "a", uint32(1+i%3), 9)
		if err := changer.AddSnapshot(ctx, b, fmt.Sprintf("pre/default/b/v1/snapshot/%020d-%d/snapshot.meta", 100+i, b)); err != nil {
			t.Fatal(err)
		}
		if i == 20 {
			apply("drop", "gone")
		}
	}
	close(stop)
	wg.Wait()
	// The changes are over: one more pass of either writer finishes.
	if _, err := writers[0].WriteDirty(ctx); err != nil {
		t.Fatal(err)
	}
	for _, err := range errs {
		t.Errorf("writer: %v", err)
	}
	if dirty, err := changer.DirtyCatalogs(ctx); err != nil || len(dirty) != 0 {
		t.Fatalf("dirty after the last pass: %v (%v)", dirty, err)
	}
	for name, id := range map[string]meta.FlowID{"a": a, "b": b, "gone": gone} {
		st, err := changer.CatalogState(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want, ok := writers[0].catalogOf(st)
		if !ok {
			t.Fatalf("flow %s has nothing to describe", name)
		}
		got, found := newest(t, bucket, name, id)
		if !found || got.Rev != st.Rev || !sameContent(got, want) {
			t.Errorf("flow %s: newest catalog rev %d (found %v), Redis at rev %d:\n got  %+v\n want %+v", name, got.Rev, found, st.Rev, got, want)
		}
	}
	// A replica that uploads a revision the other uploaded already, having
	// read another checkpoint since, finds the same content and is done.
	if _, _, err := changer.AdvanceCheckpoints(ctx, []meta.FlowID{a}, 12345, 1<<62); err != nil {
		t.Fatal(err)
	}
	if uploaded, err := writers[1].write(ctx, a); err != nil || !uploaded {
		t.Fatalf("writing a revision already in the bucket: %v, %v", uploaded, err)
	}
	if c, _ := newest(t, bucket, "gone", gone); !c.Dropped || len(c.Pending) != 2 || !bytes.Contains(c.Info, []byte(`"source_table_ids":[3]`)) {
		t.Errorf("dropped flow's catalog %+v, want it marked dropped with its last definition and both pending entries", c)
	}
}

// An object of other content at the name of a flow's next revision (placed
// there by anyone who can write the bucket) does not wedge the flow: that
// write fails, the revision moves past it, and the next write goes through.
func TestForeignCatalogObjectSkipped(t *testing.T) {
	ctx := context.Background()
	st := meta.NewStore(testenv.StartRedis(t).Client(t), "", nil)
	a, err := st.ApplyDDL(ctx, meta.DDL{Op: "create", Flow: meta.FlowInfo{FlowName: "a", SourceTableIDs: []uint32{1}}}, meta.DDLPosition{Topic: "ddl", NextOffset: 1})
	if err != nil {
		t.Fatal(err)
	}
	bucket := sink.NewMemBucket()
	cs, err := st.CatalogState(ctx, a.FlowID)
	if err != nil {
		t.Fatal(err)
	}
	name := sink.CatalogPath("pre", meta.DefaultCatalog, "a", "g", a.FlowID, cs.Rev)
	junk := []byte(`{"not":"a catalog"}`)
	if err := bucket.Upload(ctx, sink.Object{Name: name, Body: bytes.NewReader(junk), Size: int64(len(junk)), CRC32C: sink.CRC32C(junk)}); err != nil {
		t.Fatal(err)
	}
	w := &Writer{Store: st, Bucket: bucket, Prefix: "pre", Group: "g"}
	if _, err := w.WriteDirty(ctx); !errors.Is(err, ErrForeignCatalog) {
		t.Fatalf("write over a foreign object: %v, want ErrForeignCatalog", err)
	}
	if n, err := w.WriteDirty(ctx); err != nil || n != 1 {
		t.Fatalf("next write: %d, %v", n, err)
	}
	got, ok := newest(t, bucket, "a", a.FlowID)
	if !ok || got.Rev != cs.Rev+1 || got.Name != "a" {
		t.Fatalf("newest catalog %+v, want rev %d", got, cs.Rev+1)
	}
}
