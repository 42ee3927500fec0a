package catalog

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// A wide flow's catalog is streamed through a file in TempDir: the object
// holds exactly the bytes EncodeCatalog gives for the content CatalogState
// reads in one MULTI, and the file is gone after the upload.
func TestWideCatalogStreamedThroughTempFile(t *testing.T) {
	ctx := context.Background()
	st := meta.NewStore(testenv.StartRedis(t).Client(t), "", nil)
	tables := make([]uint32, 20_000)
	for i := range tables {
		tables[i] = uint32(i + 1)
	}
	a, err := st.ApplyDDL(ctx, meta.DDL{Op: "create", Flow: meta.FlowInfo{FlowName: "wide", SourceTableIDs: tables}}, meta.DDLPosition{Topic: "ddl", NextOffset: 1})
	if err != nil {
		t.Fatal(err)
	}
	bucket := sink.NewMemBucket()
	tmp := t.TempDir()
	w := &Writer{Store: st, Bucket: bucket, Prefix: "pre", Group: "g", TempDir: tmp}
	cs, err := st.CatalogState(ctx, a.FlowID)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := w.catalogOf(cs)
	if !ok {
		t.Fatal("no catalog for the flow")
	}
	want, err := sink.EncodeCatalog(c)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.WriteDirty(ctx); err != nil || n != 1 {
		t.Fatalf("WriteDirty: %d, %v", n, err)
	}
	rc, err := bucket.Get(ctx, sink.CatalogPath("pre", meta.DefaultCatalog, "wide", "g", a.FlowID, cs.Rev))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, want) {
		t.Errorf("catalog object of %d bytes differs from the %d EncodeCatalog gives", len(got), len(want))
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("the temp dir holds %d entries after the upload, want none", len(left))
	}
}
