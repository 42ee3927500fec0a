package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	byteorder "encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/klauspost/compress/zstd"
	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
)

// jsonReader reads a flow's backup as a restore tool written from
// docs/FORMAT.md alone would: the manifest from Redis, the meta JSON as
// untyped JSON (layout v1, or v2 with only the chunks whose flow_ids name
// the flow), the chunks by range reads with the storage client, zstd and
// framing by hand. It fails the test on anything that deviates from the
// documented format.
type jsonReader struct {
	t             *testing.T
	ctx           context.Context
	rdb           *redis.Client
	gcs           *storage.BucketHandle
	catalog, flow string
	flowID        uint64
}

// jsonBackup is what jsonReader found.
type jsonBackup struct {
	entries     map[string]int // "<region>/<cf>/<op>/<hex key>/<hex value>" -> count
	tables      map[int64]bool
	compression map[string]int
	offsets     [][2]int64 // [from, to) of partition 0 per meta
	checkpoint  uint64     // the global_checkpoint object
}

func (b jsonBackup) covers(off int64) bool {
	for _, r := range b.offsets {
		if off >= r[0] && off < r[1] {
			return true
		}
	}
	return false
}

func (r *jsonReader) readAll() jsonBackup {
	r.t.Helper()
	b := jsonBackup{entries: map[string]int{}, tables: map[int64]bool{}, compression: map[string]int{}}
	paths, err := r.rdb.ZRange(r.ctx, fmt.Sprintf("flowlog:{flowlog}:metas:%d", r.flowID), 0, -1).Result()
	if err != nil || len(paths) == 0 {
		r.t.Fatalf("metas of flow %d: %v (%d paths)", r.flowID, err, len(paths))
	}
	v2 := false
	for _, p := range paths {
		v2 = r.readMeta(p, &b) == 2 || v2
	}
	ckName := fmt.Sprintf("%s/%s/v1/global_checkpoint/flowlog-%d.ts", r.catalog, r.flow, r.flowID)
	if v2 {
		ckName = "v2/global_checkpoint/flowlog.ts"
	}
	ck := r.object(ckName, 0, -1)
	if len(ck) != 8 {
		r.t.Fatalf("global checkpoint object holds %d bytes, want 8", len(ck))
	}
	b.checkpoint = byteorder.LittleEndian.Uint64(ck)
	return b
}

// object reads length bytes of name from off (length -1: to the end).
func (r *jsonReader) object(name string, off, length int64) []byte {
	r.t.Helper()
	rd, err := r.gcs.Object(name).NewRangeReader(r.ctx, off, length)
	if err != nil {
		r.t.Fatalf("open %s [%d,+%d): %v", name, off, length, err)
	}
	defer rd.Close()
	data, err := io.ReadAll(rd)
	if err != nil {
		r.t.Fatalf("read %s: %v", name, err)
	}
	return data
}

// readMeta reads one meta and the flow's chunks it lists, and returns its
// version.
func (r *jsonReader) readMeta(path string, b *jsonBackup) uint64 {
	r.t.Helper()
	dec := json.NewDecoder(bytes.NewReader(r.object(path, 0, -1)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		r.t.Fatalf("meta %s: %v", path, err)
	}
	f := fields{t: r.t, where: path, m: m}
	version := f.uint("version")
	cycle, store := f.str("cycle_id"), f.str("store_id")
	minTS, maxTS, minResolved := f.uint("min_ts"), f.uint("max_ts"), f.uint("min_resolved_ts")
	phys := time.UnixMilli(int64(minTS >> 18)).UTC()
	dataPath := f.str("data_path")
	var wantMeta, wantData string
	switch version {
	case 1:
		if f.str("flow") != r.flow || f.uint("flow_id") != r.flowID || store == "" || cycle == "" {
			r.t.Errorf("meta %s: flow %q flow_id %d store_id %q cycle_id %q", path, m["flow"], m["flow_id"], store, cycle)
		}
		wantMeta = fmt.Sprintf("%s/%s/v1/backupmeta/%020d-%d-%s.meta", r.catalog, r.flow, minResolved, r.flowID, cycle)
		wantData = fmt.Sprintf("%s/%s/v1/%s/%s/%d-%d-%s.log", r.catalog, r.flow, phys.Format("20060102"), phys.Format("15"), minTS, r.flowID, cycle)
	case 2:
		named := false
		for _, fl := range f.list("flows") {
			ff := fields{t: r.t, where: path + " flows", m: fl}
			named = named || ff.uint("flow_id") == r.flowID && ff.str("catalog") == r.catalog && ff.str("name") == r.flow
		}
		if !named || store == "" || cycle == "" || f.str("group") != "flowlog" {
			r.t.Errorf("meta %s: flows %v store_id %q cycle_id %q group %v, want flow %d named", path, m["flows"], store, cycle, m["group"], r.flowID)
		}
		wantMeta = fmt.Sprintf("v2/meta/%020d-%s-%s.meta", minResolved, store, cycle)
		wantData = fmt.Sprintf("v2/log/%s/%s/%d-%s-%s.log", phys.Format("20060102"), phys.Format("15"), minTS, store, cycle)
	default:
		r.t.Fatalf("meta %s: version %d", path, version)
	}
	// A v2 meta of coverage reports only (listed under the flows it names)
	// has no files and no data object.
	covOnly := version == 2 && len(f.list("files")) == 0
	if covOnly {
		wantData = ""
		if _, ok := m["coverage"].([]any); !ok {
			r.t.Errorf("meta %s has neither files nor coverage reports", path)
		}
	}
	if path != wantMeta {
		r.t.Errorf("meta path %s, want %s", path, wantMeta)
	}
	if dataPath != wantData {
		r.t.Errorf("meta %s: data_path %s, want %s", path, dataPath, wantData)
	}
	for _, o := range f.list("offsets") {
		of := fields{t: r.t, where: path + " offsets", m: o}
		if of.str("topic") != testenv.ApplyTopic || of.uint("partition") != 0 || of.uint("from") > of.uint("to") {
			r.t.Errorf("meta %s: offsets entry %v", path, o)
		}
		b.offsets = append(b.offsets, [2]int64{int64(of.uint("from")), int64(of.uint("to"))})
	}
	files := f.list("files")
	if len(files) == 0 && !covOnly {
		r.t.Errorf("meta %s lists no files", path)
	}
	fMin, fMax, fRes := ^uint64(0), uint64(0), ^uint64(0)
	for i, fm := range files {
		ff := fields{t: r.t, where: fmt.Sprintf("%s file %d", path, i), m: fm}
		if version == 2 && !ff.holds(r.flowID) {
			continue // another flow's chunk
		}
		r.readChunk(dataPath, ff, b)
		fMin, fMax, fRes = min(fMin, ff.uint("min_ts")), max(fMax, ff.uint("max_ts")), min(fRes, ff.uint("resolved_ts"))
	}
	if version == 1 && (fMin != minTS || fMax != maxTS || fRes != minResolved) || fMin < minTS || fMax > maxTS || fRes < minResolved {
		r.t.Errorf("meta %s: min_ts %d max_ts %d min_resolved_ts %d; its files give %d %d %d", path, minTS, maxTS, minResolved, fMin, fMax, fRes)
	}
	return version
}

// holds reports whether a layout v2 file entry's flow_ids (ascending)
// name id.
func (f fields) holds(id uint64) bool {
	var last uint64
	found := false
	for i, v := range f.list("flow_ids") {
		n, err := v.(json.Number).Int64()
		if err != nil || n < 0 || i > 0 && uint64(n) <= last {
			f.t.Errorf("%s: flow_ids %v not ascending ids", f.where, f.m)
			return false
		}
		last = uint64(n)
		found = found || last == id
	}
	return found
}

// tinyChunk is the largest chunk the consumer stores uncompressed under
// --compression zstd (docs/FORMAT.md, "Data objects and chunks"), and tinyNone the
// jsonBackup.compression key such chunks count under.
const (
	tinyChunk = 2 << 10
	tinyNone  = "none (tiny)"
)

// readChunk range-reads one chunk, checks it against its file entry, and
// records its entries in b.
func (r *jsonReader) readChunk(dataPath string, f fields, b *jsonBackup) {
	r.t.Helper()
	stored := r.object(dataPath, int64(f.uint("offset")), int64(f.uint("length")))
	if int64(len(stored)) != int64(f.uint("length")) {
		r.t.Fatalf("%s: read %d bytes, length %d", f.where, len(stored), f.uint("length"))
	}
	raw := stored
	comp := f.str("compression")
	if comp == "none" && f.uint("raw_length") <= tinyChunk {
		b.compression[tinyNone]++ // stored as it is whatever --compression says
	} else {
		b.compression[comp]++
	}
	switch comp {
	case "none":
	case "zstd":
		zr, err := zstd.NewReader(nil)
		if err != nil {
			r.t.Fatal(err)
		}
		raw, err = zr.DecodeAll(stored, nil)
		zr.Close()
		if err != nil {
			r.t.Fatalf("%s: zstd: %v", f.where, err)
		}
	default:
		r.t.Fatalf("%s: compression %q", f.where, comp)
	}
	sum := sha256.Sum256(raw)
	if int64(len(raw)) != int64(f.uint("raw_length")) || f.str("sha256") != hex.EncodeToString(sum[:]) {
		r.t.Fatalf("%s: %d uncompressed bytes with sha256 %x; meta says raw_length %d sha256 %s",
			f.where, len(raw), sum, f.uint("raw_length"), f.str("sha256"))
	}
	cf, op, region, table := f.str("cf"), f.str("op"), f.uint("region_id"), int64(f.uint("table_id"))
	if (cf != "write" && cf != "default") || (op != "put" && op != "delete") || f.bool("is_meta") || f.uint("partition") != 0 {
		r.t.Errorf("%s: cf %q op %q is_meta %v partition %d", f.where, cf, op, f.bool("is_meta"), f.uint("partition"))
	}
	b.tables[table] = true
	runs := f.regionRuns(region)
	var n uint64
	minTS, maxTS, minBegin := ^uint64(0), uint64(0), ^uint64(0)
	var minKey, maxKey []byte
	for rest := raw; len(rest) > 0; n++ {
		var key, value []byte
		var ok bool
		if key, rest, ok = cutFrame(rest); ok {
			value, rest, ok = cutFrame(rest)
		}
		if !ok || len(key) < 8 {
			r.t.Fatalf("%s: bad framing at entry %d", f.where, n)
		}
		if tb, ok := tableOfDataKey(key); !ok || tb != table {
			r.t.Errorf("%s: entry %d key %x is not of table_id %d", f.where, n, key, table)
		}
		ts := ^byteorder.BigEndian.Uint64(key[len(key)-8:])
		minTS, maxTS = min(minTS, ts), max(maxTS, ts)
		if minKey == nil || bytes.Compare(key, minKey) < 0 {
			minKey = key
		}
		if bytes.Compare(key, maxKey) > 0 {
			maxKey = key
		}
		if cf == "write" && op == "put" {
			if len(value) < 2 {
				r.t.Fatalf("%s: entry %d: bad write record %x", f.where, n, value)
			}
			start, k := byteorder.Uvarint(value[1:])
			if k <= 0 {
				r.t.Fatalf("%s: entry %d: bad write record %x", f.where, n, value)
			}
			minBegin = min(minBegin, start)
		}
		// A chunk of several regions lists its runs in entry order
		// (docs/FORMAT.md, "Meta objects, version 2").
		for len(runs) > 0 && runs[0].entries == 0 {
			runs = runs[1:]
		}
		if len(runs) == 0 {
			r.t.Fatalf("%s: entry %d lies past the region runs", f.where, n)
		}
		runs[0].entries--
		b.entries[fmt.Sprintf("%d/%s/%s/%x/%x", runs[0].region, cf, op, key, value)]++
	}
	if len(runs) > 1 || len(runs) == 1 && runs[0].entries != 0 {
		r.t.Errorf("%s: region runs hold more entries than the chunk", f.where)
	}
	if !(cf == "write" && op == "put") {
		minBegin = minTS
	}
	if n != f.uint("number_of_entries") || minTS != f.uint("min_ts") || maxTS != f.uint("max_ts") || minBegin != f.uint("min_begin_ts_in_default_cf") ||
		f.str("start_key") != hex.EncodeToString(minKey) || f.str("end_key") != hex.EncodeToString(maxKey) {
		r.t.Errorf("%s: entries give n=%d min_ts=%d max_ts=%d min_begin=%d start_key=%x end_key=%x; meta %v", f.where, n, minTS, maxTS, minBegin, minKey, maxKey, f.m)
	}
	if f.uint("resolved_ts") < maxTS {
		r.t.Errorf("%s: resolved_ts %d below the chunk's max_ts %d", f.where, f.uint("resolved_ts"), maxTS)
	}
}

// cutFrame splits [u32 LE len][bytes] off b.
func cutFrame(b []byte) (field, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := byteorder.LittleEndian.Uint32(b)
	if uint64(len(b)-4) < uint64(n) {
		return nil, nil, false
	}
	return b[4 : 4+n], b[4+n:], true
}

// tableOfDataKey decodes the memcomparable groups of a data key and
// returns the table id of its raw 't' key.
func tableOfDataKey(key []byte) (int64, bool) {
	var raw []byte
	enc := key[:len(key)-8]
	for len(enc) >= 9 {
		marker := enc[8]
		pad := 0xFF - int(marker)
		if pad < 0 || pad > 8 {
			return 0, false
		}
		raw = append(raw, enc[:8-pad]...)
		enc = enc[9:]
		if pad > 0 {
			break
		}
	}
	if len(enc) != 0 || len(raw) < 9 || raw[0] != 't' {
		return 0, false
	}
	return int64(byteorder.BigEndian.Uint64(raw[1:9]) ^ 1<<63), true
}

// fields reads typed members of an untyped JSON object, failing the test
// on a missing member or one of another JSON type.
type fields struct {
	t     *testing.T
	where string
	m     any
}

func (f fields) get(name string) any {
	f.t.Helper()
	obj, ok := f.m.(map[string]any)
	if !ok {
		f.t.Fatalf("%s: not a JSON object: %v", f.where, f.m)
	}
	v, ok := obj[name]
	if !ok {
		f.t.Fatalf("%s: no %q", f.where, name)
	}
	return v
}

// regionRun is a run of a chunk's entries from one region.
type regionRun struct {
	region, entries uint64
}

// regionRuns are the region runs of a file entry: its "regions", pairs of
// [region id, entries], or, without them, one run of its region_id
// (region) holding every entry.
func (f fields) regionRuns(region uint64) []regionRun {
	f.t.Helper()
	obj, _ := f.m.(map[string]any)
	list, ok := obj["regions"]
	if !ok {
		return []regionRun{{region, f.uint("number_of_entries")}}
	}
	pairs, ok := list.([]any)
	if !ok || region != 0 {
		f.t.Fatalf("%s: regions %v beside region_id %d", f.where, list, region)
	}
	var runs []regionRun
	for _, p := range pairs {
		pair, ok := p.([]any)
		if !ok || len(pair) != 2 {
			f.t.Fatalf("%s: region run %v", f.where, p)
		}
		run := fields{t: f.t, where: f.where, m: map[string]any{"region": pair[0], "entries": pair[1]}}
		runs = append(runs, regionRun{run.uint("region"), run.uint("entries")})
	}
	return runs
}

// uint is an integer member written as a JSON number, exact to 64 bits.
func (f fields) uint(name string) uint64 {
	f.t.Helper()
	n, ok := f.get(name).(json.Number)
	if !ok {
		f.t.Fatalf("%s: %q is %T, want a JSON number", f.where, name, f.get(name))
	}
	u, err := strconv.ParseUint(n.String(), 10, 64)
	if err != nil {
		f.t.Fatalf("%s: %q = %s: %v", f.where, name, n, err)
	}
	return u
}

func (f fields) str(name string) string {
	f.t.Helper()
	s, ok := f.get(name).(string)
	if !ok {
		f.t.Fatalf("%s: %q is %T, want a string", f.where, name, f.get(name))
	}
	if strings.HasSuffix(name, "key") || name == "sha256" {
		if _, err := hex.DecodeString(s); err != nil || strings.ToLower(s) != s {
			f.t.Errorf("%s: %q = %q is not lowercase hex", f.where, name, s)
		}
	}
	return s
}

func (f fields) bool(name string) bool {
	f.t.Helper()
	v, ok := f.get(name).(bool)
	if !ok {
		f.t.Fatalf("%s: %q is %T, want a bool", f.where, name, f.get(name))
	}
	return v
}

func (f fields) list(name string) []any {
	f.t.Helper()
	v, ok := f.get(name).([]any)
	if !ok {
		f.t.Fatalf("%s: %q is %T, want an array", f.where, name, f.get(name))
	}
	return v
}
