package sink

import (
	"strings"
	"testing"
)

func TestLayoutV2Paths(t *testing.T) {
	const ts = 431656320867237891 // 2022-03-07 07:xx UTC
	for _, tc := range []struct{ got, want string }{
		{DataPathV2("backup", "host-a", ts, "1700-3-00ff"), "backup/v2/log/20220307/07/431656320867237891-host-a-1700-3-00ff.log"},
		{MetaPathV2("", "host-a", 42, "1700-3-00ff"), "v2/meta/00000000000000000042-host-a-1700-3-00ff.meta"},
		{CheckpointPathV2("a/b", "flowlog"), "a/b/v2/global_checkpoint/flowlog.ts"},
		{CatalogPath("p", "default", "demo", "my-group", 7, 3), "p/default/demo/v1/catalog/my-group-7-00000000000000000003.json"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}

func TestV2Unit(t *testing.T) {
	data := DataPathV2("p", "host-a", 431656320867237891, "1700-3-00ff")
	meta := MetaPathV2("p", "host-a", 99, "1700-3-00ff")
	for _, tc := range []struct {
		name, unit, kind string
		ok               bool
	}{
		{data, "host-a-1700-3-00ff", GCData, true},
		{meta, "host-a-1700-3-00ff", GCMeta, true},
		{"p/v2/meta/42-host-a-x.meta", "", "", false},                                             // not 20 digits
		{"p/v2/log/2022030/07/1-a-b.log", "", "", false},                                          // bad date
		{"p/v2/log/20220307/07/1-a-../b.log", "", "", false},                                      // extra element
		{"p/v2/global_checkpoint/flowlog.ts", "", "", false},                                      // never a unit
		{"other/v2/meta/00000000000000000042-a-b.meta", "", "", false},                            // other prefix
		{"p/v2/meta/00000000000000000042-a b-c.meta", "", "", false},                              // bad character
		{"p/v2/meta/00000000000000000042-nodash.meta", "", "", false},                             // no cycle part
		{"p/v2/log/20220307/07/x-host-c.log", "", "", false},                                      // min_ts not a number
		{"p/v2/meta/00000000000000000042-a-" + strings.Repeat("c", 300) + ".meta", "", "", false}, // too long
	} {
		unit, kind, ok := V2Unit("p", tc.name)
		if unit != tc.unit || kind != tc.kind || ok != tc.ok {
			t.Errorf("V2Unit(%q) = %q, %q, %v; want %q, %q, %v", tc.name, unit, kind, ok, tc.unit, tc.kind, tc.ok)
		}
	}
}

func TestParseCatalogName(t *testing.T) {
	g, id, rev, ok := ParseCatalogName("my-group-7-00000000000000000003.json")
	if !ok || g != "my-group" || id != 7 || rev != 3 {
		t.Errorf("ParseCatalogName = %q, %d, %d, %v", g, id, rev, ok)
	}
	for _, bad := range []string{"g-7-3.json", "g-07-00000000000000000003.json", "-7-00000000000000000003.json", "g-x-00000000000000000003.json", "g-7-00000000000000000003.txt"} {
		if _, _, _, ok := ParseCatalogName(bad); ok {
			t.Errorf("ParseCatalogName(%q) accepted", bad)
		}
	}
}

func validV2Meta() Meta {
	f := FileMeta{Offset: 0, Length: 16, RawLength: 16, Compression: CompressionNone, SHA256: strings.Repeat("a", 64),
		NumberOfEntries: 1, StartKey: "aa", EndKey: "bb", TableID: 1, RegionID: 1, CF: CFWrite, Op: OpPut, FlowIDs: []uint32{3, 5}}
	return Meta{Version: MetaVersion2, StoreID: "host-a", CycleID: "1-1-00", Group: "flowlog", DataPath: DataPathV2("", "host-a", 1, "1-1-00"),
		MinTS: 1, MaxTS: 2, Flows: []MetaFlow{{3, "default", "a"}, {5, "default", "b"}},
		Partitions: []PartitionState{{Topic: "t", Partition: 0, NextOffset: 10, Checkpoint: 5, HasCheckpoint: true, Regions: map[string]uint64{"1": 5}}},
		Coverage:   []CoverageReport{{FlowID: 5, Seq: 1, Topic: "t", Partition: 0, Since: CoverageValue{TS: 4}, Until: CoverageValue{TS: 4}, Upto: 1}},
		Files:      []FileMeta{f}}
}

func TestMetaV2RoundTripAndValidate(t *testing.T) {
	m := validV2Meta()
	b, err := EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Holds(5, &got.Files[0]) || got.Holds(4, &got.Files[0]) || !got.Serves(3) || got.Serves(4) {
		t.Errorf("Holds/Serves wrong for %+v", got.Files[0].FlowIDs)
	}
	if got.Partitions[0].Regions["1"] != 5 || got.Coverage[0].Since.TS != 4 {
		t.Errorf("round trip lost partition or coverage state: %+v", got)
	}
	for name, mutate := range map[string]func(*Meta){
		"no flow ids":        func(m *Meta) { m.Files[0].FlowIDs = nil },
		"unsorted flow ids":  func(m *Meta) { m.Files[0].FlowIDs = []uint32{5, 3} },
		"unknown flow id":    func(m *Meta) { m.Files[0].FlowIDs = []uint32{3, 9} },
		"flow of its own":    func(m *Meta) { m.FlowID = 3 },
		"flow twice":         func(m *Meta) { m.Flows = append(m.Flows, MetaFlow{3, "default", "c"}) },
		"bad flow name":      func(m *Meta) { m.Flows[0].Name = "a/b" },
		"unnamed with chunk": func(m *Meta) { m.Flows[0].Catalog, m.Flows[0].Name = "", "" },
		"report of no flow":  func(m *Meta) { m.Coverage[0].FlowID = 9 },
		"idle and ckpt":      func(m *Meta) { m.Partitions[0].Idle = true },
		"bad store id":       func(m *Meta) { m.StoreID = "" },
		"version 3":          func(m *Meta) { m.Version = 3 },
		"v1 with v2 flow id": func(m *Meta) {
			m.Version, m.Flow, m.FlowID, m.Flows, m.Coverage, m.Partitions = MetaVersion, "a", 3, nil, nil, nil
		},
	} {
		m := validV2Meta()
		m.Files = append([]FileMeta(nil), m.Files...)
		mutate(&m)
		if _, err := EncodeMeta(m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A flow with coverage reports and no chunk may go unnamed: one dropped
// before the meta's writer knew it, whose drop recorded no definition.
func TestMetaV2UnnamedReportOnlyFlow(t *testing.T) {
	m := validV2Meta()
	m.Flows = append(m.Flows, MetaFlow{FlowID: 7})
	m.Coverage = append(m.Coverage, CoverageReport{FlowID: 7, Seq: 2, Topic: "t", Partition: 0, Since: CoverageValue{Idle: true}, Until: CoverageValue{Idle: true}, Upto: 2})
	if _, err := EncodeMeta(m); err != nil {
		t.Fatalf("a report-only flow without a name: %v", err)
	}
	m.Flows[2].Name = "x" // a name without a catalog is no name
	if _, err := EncodeMeta(m); err == nil {
		t.Fatal("a flow with a name and no catalog accepted")
	}
}

func TestCatalogRoundTripAndValidate(t *testing.T) {
	until := uint64(9)
	c := Catalog{Version: CatalogVersion, Group: "g", FlowID: 3, Catalog: "default", Name: "demo", Rev: 4,
		Info:    []byte(`{"flow_name":"demo"}`),
		Windows: []CatalogWindow{{TableID: 1, Since: 5}, {TableID: 2, Since: 3, Until: &until}},
		History: []CatalogWindow{{TableID: 1, Since: 1, Until: &until}}, Pending: []CatalogPending{{Seq: 7, Removed: []uint32{1}}},
		CoverageSeq: 7, Snapshots: []CatalogSnapshot{{TS: 3, Path: "a"}, {TS: 8, Path: "b"}}, CheckpointTS: 10,
		DDL: &CatalogDDL{Topic: "flowlog.ddl", Partition: 0, Next: 12}}
	b, err := EncodeCatalog(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCatalog(b)
	if err != nil || got.Rev != 4 || len(got.Windows) != 2 || *got.Windows[1].Until != 9 || got.DDL.Next != 12 {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	// A table removed before any partition saw past its addition has a
	// window that holds nothing (until < since): a catalog holds it as is.
	empty := c
	early := uint64(2)
	empty.Windows = []CatalogWindow{{TableID: 1, Since: 5, Until: &early}}
	if _, err := EncodeCatalog(empty); err != nil {
		t.Errorf("a catalog with an empty window: %v", err)
	}
	for name, mutate := range map[string]func(*Catalog){
		"no rev":             func(c *Catalog) { c.Rev = 0 },
		"table twice":        func(c *Catalog) { c.Windows = append(c.Windows, CatalogWindow{TableID: 1}) },
		"step of no table":   func(c *Catalog) { c.Pending[0].Removed = nil },
		"tables unsorted":    func(c *Catalog) { c.Pending[0].Added = []uint32{4, 3} },
		"seq past counter":   func(c *Catalog) { c.Pending[0].Seq = 8 },
		"snapshots unsorted": func(c *Catalog) { c.Snapshots[0].TS = 9 },
		"bad name":           func(c *Catalog) { c.Name = "../x" },
	} {
		c2 := c
		c2.Windows = append([]CatalogWindow(nil), c.Windows...)
		c2.Pending = append([]CatalogPending(nil), c.Pending...)
		c2.Snapshots = append([]CatalogSnapshot(nil), c.Snapshots...)
		mutate(&c2)
		if _, err := EncodeCatalog(c2); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
