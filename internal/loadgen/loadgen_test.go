package loadgen

import (
	"bytes"
	"flag"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/event"
)

// encodeAll runs a generator to the end and returns every record value.
func encodeAll(t *testing.T, cfg Config, json bool) ([][]byte, *Generator) {
	t.Helper()
	g := New(cfg)
	var out [][]byte
	for {
		b, ok := g.Next()
		if !ok {
			return out, g
		}
		if json {
			v, err := event.EncodeBatchJSON(b)
			if err != nil {
				t.Fatalf("EncodeBatchJSON: %v", err)
			}
			out = append(out, v)
		} else {
			out = append(out, event.EncodeBatch(nil, b))
		}
	}
}

func TestDeterminism(t *testing.T) {
	cfg := Config{Events: 3000, Tables: []int64{1, 2, 3}, Regions: 5, ValueSize: 300, Seed: 7, HeartbeatEvery: 3}
	a, _ := encodeAll(t, cfg, false)
	b, _ := encodeAll(t, cfg, false)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same config gave different bytes")
	}
	cfg.Seed = 8
	c, _ := encodeAll(t, cfg, false)
	if reflect.DeepEqual(a, c) {
		t.Fatal("different seeds gave the same bytes")
	}
	if !reflect.DeepEqual(Mutations(cfg), Mutations(cfg)) {
		t.Fatal("Mutations is not deterministic")
	}
}

// decoded is what a reader of the wire format reconstructs from the load.
type decoded struct {
	muts      []Mutation
	locks     int
	rollbacks int
	events    int
}

// decodeLoad decodes every record as the consumer and restore would, and
// checks the per-region ordering and resolved-ts invariants on the way.
func decodeLoad(t *testing.T, cfg Config, records [][]byte, json bool) decoded {
	t.Helper()
	cfg = cfg.withDefaults()
	ct := ""
	if json {
		ct = "application/json"
	}
	var d decoded
	lastResolved := map[uint64]uint64{}
	lastCommit := map[uint64]uint64{}
	for i, rec := range records {
		var b event.Batch
		if err := event.DecodeBatch(&b, rec, ct); err != nil {
			t.Fatalf("record %d: DecodeBatch: %v", i, err)
		}
		if b.RegionID < 1 || b.RegionID > uint64(cfg.Regions) {
			t.Fatalf("record %d: region %d out of range", i, b.RegionID)
		}
		if b.ResolvedTS < lastResolved[b.RegionID] {
			t.Fatalf("record %d: region %d resolved ts went back", i, b.RegionID)
		}
		defaults := map[string][]byte{} // raw key + start ts -> value
		for _, e := range b.Events {
			d.events++
			if e.CF == event.CFLock {
				d.locks++
				continue
			}
			raw, ts, err := event.DecodeDataKey(e.Key)
			if err != nil {
				t.Fatalf("record %d: DecodeDataKey: %v", i, err)
			}
			if e.CF == event.CFDefault {
				defaults[fmt.Sprintf("%x/%d", raw, ts)] = bytes.Clone(e.Value)
				continue
			}
			if ts <= lastResolved[b.RegionID] || ts > b.ResolvedTS || ts < lastCommit[b.RegionID] {
				t.Fatalf("record %d: commit ts %d outside (%d, %d] or out of order", i, ts, lastResolved[b.RegionID], b.ResolvedTS)
			}
			lastCommit[b.RegionID] = ts
			w, err := event.DecodeWrite(e.Value)
			if err != nil {
				t.Fatalf("record %d: DecodeWrite: %v", i, err)
			}
			if w.Type == event.WriteRollback {
				d.rollbacks++
				continue
			}
			table, ok := event.TableIDOfRaw(raw)
			if !ok || !bytes.Equal(raw[:9], event.TablePrefix(table)) {
				t.Fatalf("record %d: key %x is not a table key", i, raw)
			}
			handle := int64(uint64(raw[11])<<56|uint64(raw[12])<<48|uint64(raw[13])<<40|uint64(raw[14])<<32|
				uint64(raw[15])<<24|uint64(raw[16])<<16|uint64(raw[17])<<8|uint64(raw[18])) ^ -1<<63
			m := Mutation{Table: table, Handle: handle, RawKey: bytes.Clone(raw), Region: b.RegionID,
				CommitTS: ts, StartTS: w.StartTS, Delete: w.Type == event.WriteDelete}
			if !m.Delete {
				if w.HasShortValue {
					m.Value = bytes.Clone(w.ShortValue)
				} else {
					m.Value = defaults[fmt.Sprintf("%x/%d", raw, w.StartTS)]
				}
			}
			d.muts = append(d.muts, m)
		}
		lastResolved[b.RegionID] = b.ResolvedTS
	}
	return d
}

func TestDecodeMatchesMutations(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		json bool
	}{
		{"short values proto", Config{Events: 4000, Tables: []int64{1, 2, 3}, Regions: 6, Seed: 1}, false},
		{"large values json", Config{Events: 2000, Tables: []int64{5, 9}, Regions: 3, ValueSize: 400, Seed: 2, HeartbeatEvery: 2}, true},
		{"one region no deletes", Config{Events: 500, Regions: 1, DeleteRatio: -1, Seed: 3, BatchSize: 7}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			records, g := encodeAll(t, tc.cfg, tc.json)
			d := decodeLoad(t, tc.cfg, records, tc.json)
			want := Mutations(tc.cfg)
			if len(d.muts) != len(want) {
				t.Fatalf("decoded %d mutations, Mutations has %d", len(d.muts), len(want))
			}
			for i := range want {
				if !reflect.DeepEqual(d.muts[i], want[i]) {
					t.Fatalf("mutation %d: decoded %+v, want %+v", i, d.muts[i], want[i])
				}
			}
			if d.events != g.Events() {
				t.Errorf("decoded %d events, generator counted %d", d.events, g.Events())
			}
			if g.Transactions() != tc.cfg.Events || len(want)+d.rollbacks != tc.cfg.Events {
				t.Errorf("transactions %d, mutations %d + rollbacks %d, want %d", g.Transactions(), len(want), d.rollbacks, tc.cfg.Events)
			}
			if tc.cfg.Events >= 2000 && (d.locks == 0 || d.rollbacks == 0) {
				t.Errorf("locks %d, rollbacks %d: want some of each", d.locks, d.rollbacks)
			}
			cfg := g.Config()
			deletes := 0
			for _, m := range want {
				if m.Handle%int64(cfg.Regions) != int64(m.Region-1) || m.Handle >= int64(cfg.Rows) {
					t.Fatalf("handle %d in region %d of %d (rows %d)", m.Handle, m.Region, cfg.Regions, cfg.Rows)
				}
				if m.StartTS >= m.CommitTS {
					t.Fatalf("start ts %d not below commit ts %d", m.StartTS, m.CommitTS)
				}
				if m.Delete {
					deletes++
				} else if len(m.Value) != cfg.ValueSize || !bytes.HasPrefix(m.Value, []byte(Marker)) {
					t.Fatalf("value %q: want %d bytes starting with the marker", m.Value, cfg.ValueSize)
				}
			}
			if tc.cfg.DeleteRatio < 0 && deletes != 0 || tc.cfg.DeleteRatio == 0 && (deletes == 0 || deletes > len(want)/5) {
				t.Errorf("%d deletes of %d mutations with ratio %v", deletes, len(want), tc.cfg.DeleteRatio)
			}
			// The load ends with one heartbeat per region, all at MaxResolvedTS.
			tail := records[len(records)-cfg.Regions:]
			seen := map[uint64]bool{}
			for _, rec := range tail {
				var b event.Batch
				ct := ""
				if tc.json {
					ct = "application/json"
				}
				if err := event.DecodeBatch(&b, rec, ct); err != nil {
					t.Fatal(err)
				}
				if len(b.Events) != 0 || b.ResolvedTS != g.MaxResolvedTS() {
					t.Fatalf("final batch of region %d: %d events, resolved %d, want 0 and %d", b.RegionID, len(b.Events), b.ResolvedTS, g.MaxResolvedTS())
				}
				seen[b.RegionID] = true
			}
			if len(seen) != cfg.Regions {
				t.Fatalf("final heartbeats cover %d regions, want %d", len(seen), cfg.Regions)
			}
			if last := want[len(want)-1].CommitTS; g.MaxResolvedTS() <= last {
				t.Fatalf("max resolved ts %d not past the last commit %d", g.MaxResolvedTS(), last)
			}
			if got := event.PhysicalTime(g.MaxResolvedTS()); got.Before(cfg.StartTime) || got.After(cfg.StartTime.Add(time.Hour)) {
				t.Errorf("physical time %v far from start %v", got, cfg.StartTime)
			}
		})
	}
}

func TestRowKeyMatchesEvent(t *testing.T) {
	for _, c := range [][2]int64{{1, 0}, {1, 1}, {42, -5}, {1 << 40, 1<<62 + 3}} {
		if got, want := rowKey(c[0], c[1]), event.RowKey(c[0], c[1]); !bytes.Equal(got, want) {
			t.Errorf("rowKey(%d, %d) = %x, event.RowKey = %x", c[0], c[1], got, want)
		}
	}
}

func TestExpected(t *testing.T) {
	k := func(h int64) []byte { return rowKey(1, h) }
	muts := []Mutation{
		{Table: 1, RawKey: k(1), CommitTS: 10, Value: []byte("a1")},
		{Table: 1, RawKey: k(2), CommitTS: 11, Value: []byte("b1")},
		{Table: 1, RawKey: k(1), CommitTS: 20, Value: []byte("a2")},
		{Table: 1, RawKey: k(2), CommitTS: 21, Delete: true},
		{Table: 2, RawKey: rowKey(2, 1), CommitTS: 15, Value: []byte("c1")},
		{Table: 2, RawKey: rowKey(2, 1), CommitTS: 30, Delete: true},
	}
	for _, tc := range []struct {
		ts   uint64
		want map[int64]map[string]Row
	}{
		{9, map[int64]map[string]Row{}},
		{10, map[int64]map[string]Row{1: {string(k(1)): {[]byte("a1"), 10}}}},
		{19, map[int64]map[string]Row{1: {string(k(1)): {[]byte("a1"), 10}, string(k(2)): {[]byte("b1"), 11}}, 2: {string(rowKey(2, 1)): {[]byte("c1"), 15}}}},
		{21, map[int64]map[string]Row{1: {string(k(1)): {[]byte("a2"), 20}}, 2: {string(rowKey(2, 1)): {[]byte("c1"), 15}}}},
		{99, map[int64]map[string]Row{1: {string(k(1)): {[]byte("a2"), 20}}}},
	} {
		t.Run(fmt.Sprint("ts=", tc.ts), func(t *testing.T) {
			if got := Expected(muts, tc.ts); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Expected(%d) = %v, want %v", tc.ts, got, tc.want)
			}
		})
	}
}

func TestConfigFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--tables", "1,2,3", "--start-time", "2022-03-07T07:00:00Z"}, ""},
		{[]string{"--value-size", "10"}, "value size"},
		{[]string{"--tables", "0"}, "table id 0"},
		{[]string{"--events", "-1"}, "events"},
		{[]string{"--delete-ratio", "1.5"}, "delete ratio"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var c Config
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			c.RegisterFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := c.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(c.Tables, []int64{1, 2, 3}) || !c.StartTime.Equal(time.Date(2022, 3, 7, 7, 0, 0, 0, time.UTC)) {
					t.Fatalf("parsed %+v", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// Span bounds how far a load's TSO clocks move past StartTime, so that a
// producer starting a load Span before now never publishes a ts ahead of
// the clock (a consumer refuses ts past its --max-clock-skew).
func TestSpanBoundsTheLoad(t *testing.T) {
	for _, cfg := range []Config{
		{Events: 100_000, Regions: 4},
		{Events: 100_000, Regions: 64, DeleteRatio: -1},
		{Events: 50_000, Regions: 1, ValueSize: 300},
		{Events: 3_000, Regions: 3_000},
	} {
		t.Run(fmt.Sprintf("%d events, %d regions", cfg.Events, cfg.Regions), func(t *testing.T) {
			cfg.StartTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			g := New(cfg)
			for {
				if _, ok := g.Next(); !ok {
					break
				}
			}
			span := event.PhysicalTime(g.MaxTS()).Sub(cfg.StartTime)
			if est := cfg.Span(); span > est || span < (est-time.Second)/2 {
				t.Errorf("the load's ts span %v past its start; Span() = %v, want it above and within 2x of the per-transaction part", span, est)
			}
		})
	}
}
