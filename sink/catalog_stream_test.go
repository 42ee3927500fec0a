package sink_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// CatalogEncoder writes, part by part, the bytes EncodeCatalog writes for
// the whole catalog, and refuses what Validate refuses.
func TestCatalogEncoderMatchesEncodeCatalog(t *testing.T) {
	u := uint64(9)
	full := sink.Catalog{Version: sink.CatalogVersion, Group: "g", FlowID: 3, Catalog: "default", Name: "f", Rev: 4,
		Info: json.RawMessage(`{"flow_name":"f"}`), Routes: map[string]json.RawMessage{"0": json.RawMessage(`{"peer":{"id":1}}`)},
		Windows:     []sink.CatalogWindow{{TableID: 1, Since: 2}, {TableID: 5, Since: 3, Until: &u}},
		History:     []sink.CatalogWindow{{TableID: 1, Since: 0, Until: &u}},
		Pending:     []sink.CatalogPending{{Seq: 2, Added: []uint32{7, 8}}, {Seq: 3, Removed: []uint32{5}, Ckpt: 6}},
		CoverageSeq: 3, TruncatedBefore: 1, Snapshots: []sink.CatalogSnapshot{{TS: 1, Path: "p"}}, CheckpointTS: 11,
		DDL: &sink.CatalogDDL{Topic: "ddl", Partition: 0, Next: 12}}
	for name, c := range map[string]sink.Catalog{
		"full":    full,
		"minimal": {Version: sink.CatalogVersion, Group: "g", FlowID: 3, Catalog: "default", Name: "f", Rev: 1, Info: json.RawMessage(`{}`)},
		"dropped, no history": func() sink.Catalog {
			c := full
			c.Dropped, c.History = true, nil
			return c
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			want, err := sink.EncodeCatalog(c)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			e, err := sink.NewCatalogEncoder(&buf, c)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range c.Windows {
				if err := e.Window(w); err != nil {
					t.Fatal(err)
				}
			}
			for _, w := range c.History {
				if err := e.History(w); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range c.Pending {
				if err := e.Pending(p); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("streamed\n%s\nwant\n%s", buf.Bytes(), want)
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		e, err := sink.NewCatalogEncoder(&bytes.Buffer{}, full)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Window(sink.CatalogWindow{TableID: 5}); err != nil {
			t.Fatal(err)
		}
		if err := e.Window(sink.CatalogWindow{TableID: 5}); err == nil {
			t.Error("a table's window twice was written")
		}
		e, _ = sink.NewCatalogEncoder(&bytes.Buffer{}, full)
		if err := e.Pending(sink.CatalogPending{Seq: 4, Added: []uint32{1}}); err == nil {
			t.Error("a pending step past coverage_seq was written")
		}
	})
}
