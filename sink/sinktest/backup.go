package sinktest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

// Entry is one recorded apply event of a hand-built backup.
type Entry struct {
	Key     []byte // data key as stored (encoded raw key + inverted ts)
	Value   []byte
	TableID int64
	CF      string // "write" or "default"
	Op      string // "put" or "delete"
	IsMeta  bool
	// RegionID is the region that sent the entry; entries of different
	// regions go in different chunks, unless a CycleV2 has MultiRegion.
	RegionID uint64
	// FlowIDs are the flows that routed the entry, in a layout v2 cycle
	// (WriteCycleV2); ascending.
	FlowIDs []uint32
}

// Cycle describes one flush cycle of one flow to write with WriteCycle.
type Cycle struct {
	Prefix, Catalog, Flow string
	FlowID                uint32
	CycleID               string
	Compression           string // default "none"
	ResolvedTS            uint64 // every chunk's resolved_ts and the meta's min_resolved_ts
	Offsets               []sink.OffsetRange
	Entries               []Entry
}

// WriteCycle stores c as the pipeline does: one data object with a chunk per
// (table, cf, op, is_meta, region) in first-seen order, then the meta object. It
// returns the meta and the meta object's name.
func WriteCycle(t testing.TB, b sink.Bucket, c Cycle) (sink.Meta, string) {
	t.Helper()
	m := sink.Meta{Version: sink.MetaVersion, Flow: c.Flow, FlowID: c.FlowID, StoreID: "sinktest", CycleID: c.CycleID,
		MinResolvedTS: c.ResolvedTS, Offsets: c.Offsets}
	data := buildChunks(t, &m, c.Compression, c.ResolvedTS, c.Entries, false)
	m.DataPath = sink.DataPath(c.Prefix, c.Catalog, c.Flow, c.FlowID, m.MinTS, c.CycleID)
	path := sink.MetaPath(c.Prefix, c.Catalog, c.Flow, c.FlowID, c.ResolvedTS, c.CycleID)
	upload(t, b, m, data, path)
	return m, path
}

// CycleV2 describes one layout v2 flush cycle to write with WriteCycleV2:
// the entries of every flow it serves in one data object, a chunk of
// entries several flows routed stored once.
type CycleV2 struct {
	Prefix, StoreID, CycleID, Group string
	Compression                     string // default "none"
	ResolvedTS                      uint64
	// Flows are the flows the cycle serves; those that Entries name must
	// be among them.
	Flows      []sink.MetaFlow
	Offsets    []sink.OffsetRange
	Partitions []sink.PartitionState
	Coverage   []sink.CoverageReport
	Entries    []Entry // each with its FlowIDs
	// MultiRegion writes a chunk per (table, cf, op, is_meta, flow ids)
	// holding the entries of every region, as the consumer does: a chunk
	// of several regions lists their runs (sink.FileMeta.Regions).
	MultiRegion bool
}

// WriteCycleV2 stores c as a layout v2 cycle: one data object with a chunk
// per (table, cf, op, is_meta, flow ids, region) in first-seen order, or
// per (table, cf, op, is_meta, flow ids) with MultiRegion, then the
// version 2 meta. It returns the meta and the meta object's name.
func WriteCycleV2(t testing.TB, b sink.Bucket, c CycleV2) (sink.Meta, string) {
	t.Helper()
	m := sink.Meta{Version: sink.MetaVersion2, StoreID: c.StoreID, CycleID: c.CycleID, Group: c.Group, MinResolvedTS: c.ResolvedTS,
		Flows: c.Flows, Offsets: c.Offsets, Partitions: c.Partitions, Coverage: c.Coverage}
	if m.StoreID == "" {
		m.StoreID = "sinktest"
	}
	if m.Group == "" {
		m.Group = "flowlog"
	}
	path := sink.MetaPathV2(c.Prefix, m.StoreID, c.ResolvedTS, c.CycleID)
	if len(c.Entries) == 0 {
		// Coverage reports or partition commits only: a meta without a
		// data object, as the consumer writes it.
		m.Files, m.MinTS, m.MaxTS = []sink.FileMeta{}, 0, 0
		upload(t, b, m, nil, path)
		return m, path
	}
	data := buildChunks(t, &m, c.Compression, c.ResolvedTS, c.Entries, c.MultiRegion)
	m.DataPath = sink.DataPathV2(c.Prefix, m.StoreID, m.MinTS, c.CycleID)
	upload(t, b, m, data, path)
	return m, path
}

// buildChunks writes entries as chunks, one per (table, cf, op, is_meta,
// flow ids, region) in first-seen order, into a data object; with
// multiRegion the region is not part of the key and a chunk of several
// regions lists their runs. It sets m's files and ts range and returns the
// object's bytes.
func buildChunks(t testing.TB, m *sink.Meta, compression string, resolved uint64, entries []Entry, multiRegion bool) []byte {
	t.Helper()
	if compression == "" {
		compression = sink.CompressionNone
	}
	type group struct {
		table  int64
		cf, op string
		meta   bool
		flows  string
		region uint64
	}
	chunks := map[group][]Entry{}
	var order []group
	for _, e := range entries {
		g := group{e.TableID, e.CF, e.Op, e.IsMeta, fmt.Sprint(e.FlowIDs), e.RegionID}
		if multiRegion {
			g.region = 0
		}
		if _, ok := chunks[g]; !ok {
			order = append(order, g)
		}
		chunks[g] = append(chunks[g], e)
	}
	var buf bytes.Buffer
	w, err := sink.NewObjectWriter(&buf, compression)
	if err != nil {
		t.Fatal(err)
	}
	m.MinTS = math.MaxUint64
	for _, g := range order {
		var framed []byte
		f := sink.FileMeta{Compression: compression, TableID: g.table, CF: g.cf, Op: g.op, IsMeta: g.meta,
			MinTS: math.MaxUint64, MinBeginTSInDefaultCF: math.MaxUint64, ResolvedTS: resolved, FlowIDs: chunks[g][0].FlowIDs, RegionID: g.region}
		var minKey, maxKey []byte
		for _, e := range chunks[g] {
			_, ts, err := event.SplitDataKey(e.Key)
			if err != nil {
				t.Fatalf("entry key: %v", err)
			}
			framed = event.AppendEntry(framed, e.Key, e.Value)
			if k := len(f.Regions) - 1; k >= 0 && f.Regions[k].Region == e.RegionID {
				f.Regions[k].Entries++
			} else {
				f.Regions = append(f.Regions, sink.RegionRun{Region: e.RegionID, Entries: 1})
			}
			f.NumberOfEntries++
			f.MinTS, f.MaxTS = min(f.MinTS, ts), max(f.MaxTS, ts)
			if g.cf == "write" && g.op == "put" {
				if wr, err := event.DecodeWrite(e.Value); err == nil {
					f.MinBeginTSInDefaultCF = min(f.MinBeginTSInDefaultCF, wr.StartTS)
				}
			}
			if minKey == nil || bytes.Compare(e.Key, minKey) < 0 {
				minKey = e.Key
			}
			if bytes.Compare(e.Key, maxKey) > 0 {
				maxKey = e.Key
			}
		}
		if len(f.Regions) == 1 {
			f.RegionID, f.Regions = f.Regions[0].Region, nil
		}
		if f.MinBeginTSInDefaultCF == math.MaxUint64 {
			f.MinBeginTSInDefaultCF = f.MinTS
		}
		f.StartKey, f.EndKey = hex.EncodeToString(minKey), hex.EncodeToString(maxKey)
		if f.Offset, f.Length, f.RawLength, err = w.AddChunk(bytes.NewReader(framed)); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(framed)
		f.SHA256 = hex.EncodeToString(sum[:])
		m.Files = append(m.Files, f)
		m.MinTS, m.MaxTS = min(m.MinTS, f.MinTS), max(m.MaxTS, f.MaxTS)
	}
	if len(m.Files) == 0 {
		m.MinTS = 0
	}
	return buf.Bytes()
}

// upload stores a cycle's data object and then its meta.
func upload(t testing.TB, b sink.Bucket, m sink.Meta, data []byte, path string) {
	t.Helper()
	ctx := context.Background()
	if m.DataPath != "" {
		if err := b.Upload(ctx, sink.Object{Name: m.DataPath, Body: bytes.NewReader(data), Size: int64(len(data)), CRC32C: sink.CRC32C(data)}); err != nil {
			t.Fatalf("upload %s: %v", m.DataPath, err)
		}
	}
	mb, err := sink.EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(ctx, sink.Object{Name: path, Body: bytes.NewReader(mb), Size: int64(len(mb)), CRC32C: sink.CRC32C(mb)}); err != nil {
		t.Fatalf("upload %s: %v", path, err)
	}
}

// WritePut returns the write-CF entry of a put of row (table, handle)
// committed at commit: with the short value inline if short is true, else
// with a default-CF entry at start that the caller adds (see DefaultPut).
func WritePut(table, handle int64, start, commit uint64, value []byte, short bool) Entry {
	w := event.Write{Type: event.WritePut, StartTS: start}
	if short {
		w.ShortValue, w.HasShortValue = value, true
	}
	return WriteRecord(table, handle, commit, w)
}

// WriteRecord returns the write-CF put entry holding w for row (table,
// handle) at commit ts commit.
func WriteRecord(table, handle int64, commit uint64, w event.Write) Entry {
	v, err := event.AppendWrite(nil, w)
	if err != nil {
		panic(fmt.Sprintf("sinktest: %v", err))
	}
	return Entry{Key: event.AppendDataKey(nil, event.RowKey(table, handle), commit), Value: v, TableID: table, CF: "write", Op: "put"}
}

// DefaultPut returns the default-CF entry holding value for row (table,
// handle) at start ts start.
func DefaultPut(table, handle int64, start uint64, value []byte) Entry {
	return Entry{Key: event.AppendDataKey(nil, event.RowKey(table, handle), start), Value: value, TableID: table, CF: "default", Op: "put"}
}

// WriteCatalog stores c as its catalog object under prefix and returns the
// object's name.
func WriteCatalog(t testing.TB, b sink.Bucket, prefix string, c sink.Catalog) string {
	t.Helper()
	raw, err := sink.EncodeCatalog(c)
	if err != nil {
		t.Fatal(err)
	}
	name := sink.CatalogPath(prefix, c.Catalog, c.Name, c.Group, c.FlowID, c.Rev)
	if err := b.Upload(context.Background(), sink.Object{Name: name, Body: bytes.NewReader(raw), Size: int64(len(raw)), CRC32C: sink.CRC32C(raw)}); err != nil {
		t.Fatalf("upload %s: %v", name, err)
	}
	return name
}
