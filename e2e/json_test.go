package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	byteorder "encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/klauspost/compress/zstd"
	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestJSONFromNonGoClient produces hand-written protojson ApplyBatch records
// with kcat (librdkafka, no flowlog code involved) and reads the backup back
// with jsonReader, a reader of DESIGN 6 that shares no code with sink: the
// valid records' table 1 and 2 events are stored exactly once, exactly as
// documented, and the malformed records land in the DLQ with their
// flowlog-* headers.
func TestJSONFromNonGoClient(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatalf("kcat not found (%v): install the Debian package kcat (.ci/run does)", err)
	}
	for _, compression := range []string{"zstd", "none"} {
		t.Run(compression, func(t *testing.T) {
			testJSONFromKcat(t, kcat, compression)
		})
	}
}

// hand-built TSOs: physical Unix ms << 18 | logical.
var jsonBase = time.Date(2026, 3, 1, 10, 30, 0, 0, time.UTC).UnixMilli()

func tso(offsetMillis int64, logical uint64) uint64 {
	return uint64(jsonBase+offsetMillis)<<18 | logical
}

// rowKey is the raw TiKV row key of DESIGN 3, written out by hand.
func rowKey(table, handle int64) []byte {
	k := []byte{'t'}
	k = byteorder.BigEndian.AppendUint64(k, uint64(table)^1<<63)
	k = append(k, '_', 'r')
	return byteorder.BigEndian.AppendUint64(k, uint64(handle)^1<<63)
}

// dataKey is the memcomparable encoding of raw (groups of 8 bytes, each
// padded and followed by 0xFF - pad, a final group always written) followed
// by BE64(^ts).
func dataKey(raw []byte, ts uint64) []byte {
	var k []byte
	for i := 0; ; i += 8 {
		group := make([]byte, 8)
		n := copy(group, raw[min(i, len(raw)):])
		k = append(append(k, group...), byte(0xFF-(8-n)))
		if n < 8 {
			break
		}
	}
	return byteorder.BigEndian.AppendUint64(k, ^ts)
}

// writeRecord is a TiKV write-CF value: type, uvarint start ts, and the
// short value flag when short is not nil.
func writeRecord(typ byte, start uint64, short []byte) []byte {
	v := byteorder.AppendUvarint([]byte{typ}, start)
	if short != nil {
		v = append(append(v, 'v', byte(len(short))), short...)
	}
	return v
}

// jsonEvent is one event of a hand-built record and whether the flow on
// tables 1 and 2 stores it.
type jsonEvent struct {
	key, value []byte
	cf, op     string // "write"/"default"/"lock", "put"/"delete"
	table      int64
	stored     bool
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func testJSONFromKcat(t *testing.T, kcat, compression string) {
	c := startCluster(t, 1)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "fj", "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-json", "--compression", compression)
	resolved := tso(60_000, 0)

	// Region 7 (camelCase, enum names, uint64 as strings): a row of table 1
	// with a long value (default-CF put + write record), a delete of a row of
	// table 2, a lock-CF event and a row of table 3 (neither is stored).
	s1, c1, s2, c2 := tso(1000, 1), tso(1000, 2), tso(2000, 0), tso(2500, 7)
	long := bytes.Repeat([]byte("kcat-long-value-"), 20)
	r7 := []jsonEvent{
		{dataKey(rowKey(1, 10), s1), long, "default", "put", 1, true},
		{dataKey(rowKey(1, 10), c1), writeRecord('P', s1, nil), "write", "put", 1, true},
		{dataKey(rowKey(2, 11), c2), writeRecord('D', s2, nil), "write", "put", 2, true},
		{append([]byte{'z'}, rowKey(1, 12)...), []byte("lock"), "lock", "put", 1, false},
		{dataKey(rowKey(3, 13), c2), writeRecord('P', s2, []byte("t3")), "write", "put", 3, false},
	}
	// Region 8 (snake_case, enum numbers, uint64 as numbers): a short-value
	// put of table 2 and a write-CF delete event of table 1.
	s3, c3 := tso(3000, 0), tso(3001, 0)
	r8 := []jsonEvent{
		{dataKey(rowKey(2, 20), c3), writeRecord('P', s3, []byte("short-kcat")), "write", "put", 2, true},
		{dataKey(rowKey(1, 21), c3), writeRecord('P', s3, []byte("gone")), "write", "delete", 1, true},
	}
	camel := func(region uint64, rts uint64, evs []jsonEvent) string {
		var es []string
		for _, e := range evs {
			es = append(es, fmt.Sprintf(`{"key":%q,"value":%q,"cf":"CF_%s","op":"OP_%s"}`,
				b64(e.key), b64(e.value), strings.ToUpper(e.cf), strings.ToUpper(e.op)))
		}
		return fmt.Sprintf(`{"regionId":"%d","resolvedTs":"%d","events":[%s]}`, region, rts, strings.Join(es, ","))
	}
	snake := func(region uint64, rts uint64, evs []jsonEvent) string {
		var es []string
		for _, e := range evs {
			cf := map[string]int{"default": 0, "write": 1, "lock": 2}[e.cf]
			op := map[string]int{"put": 0, "delete": 1}[e.op]
			es = append(es, fmt.Sprintf(`{"key":%q,"value":%q,"cf":%d,"op":%d}`, b64(e.key), b64(e.value), cf, op))
		}
		return fmt.Sprintf(`{"region_id":%d,"resolved_ts":%d,"events":[%s]}`, region, rts, strings.Join(es, ","))
	}
	type rec struct {
		key, value string
		valid      bool
	}
	recs := []rec{
		{"7", camel(7, c2, r7), true},
		{"9", `{"region_id": 9, "resolved_ts": 5, "events": [{"key": "dA==", "va`, false}, // truncated
		{"8", snake(8, resolved, r8), true},
		// A record with a decodable event and one whose value is not base64:
		// the record is atomic, so neither event is stored.
		{"8", `{"region_id":8,"resolved_ts":` + strconv.FormatUint(resolved, 10) + `,"events":[` +
			`{"key":"` + b64(dataKey(rowKey(1, 30), c3)) + `","value":"` + b64(writeRecord('P', s3, []byte("dlq"))) + `","cf":1},` +
			`{"key":"` + b64(dataKey(rowKey(1, 31), c3)) + `","value":"***not base64***","cf":1}]}`, false},
		{"7", camel(7, resolved, nil), true}, // heartbeat
	}
	var in strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&in, "%s|%s\n", r.key, r.value)
	}
	cmd := exec.Command(kcat, "-P", "-b", c.Broker.Addr, "-t", testenv.ApplyTopic, "-p", "0", "-K", "|",
		"-H", "content-type=application/json")
	cmd.Stdin = strings.NewReader(in.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kcat -P: %v\n%s", err, out)
	}

	// Every DLQ record keeps its original key and value and says where it
	// came from.
	dlq := consumeAll(t, c.Broker.Addr, testenv.DLQTopic, 2)
	wantDLQ := map[int64]rec{1: recs[1], 3: recs[3]}
	for _, r := range dlq {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		off, err := strconv.ParseInt(h["flowlog-source-offset"], 10, 64)
		w, ok := wantDLQ[off]
		if err != nil || !ok {
			t.Errorf("DLQ record with flowlog-source-offset %q; want offsets 1 and 3", h["flowlog-source-offset"])
			continue
		}
		delete(wantDLQ, off)
		if string(r.Key) != w.key || string(r.Value) != w.value {
			t.Errorf("DLQ record of offset %d: key %q value %q, want the original %q %q", off, r.Key, r.Value, w.key, w.value)
		}
		if h["flowlog-source-topic"] != testenv.ApplyTopic || h["flowlog-source-partition"] != "0" || h["flowlog-error"] == "" {
			t.Errorf("DLQ record of offset %d: headers %v", off, h)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rdb := c.Redis.Client(t)
	id := waitRawCheckpoint(ctx, t, rdb, "fj", resolved)
	rd := &jsonReader{t: t, ctx: ctx, rdb: rdb, gcs: c.GCS.Client.Bucket(c.GCS.Bucket), catalog: "default", flow: "fj", flowID: id}
	got := rd.readAll()

	t.Logf("%d metas, chunks by compression %v, %d distinct entries, offsets %v, checkpoint %d", len(got.offsets), got.compression, len(got.entries), got.offsets, got.checkpoint)
	want := map[string]jsonEvent{}
	for region, evs := range map[uint64][]jsonEvent{7: r7, 8: r8} {
		for _, e := range evs {
			if e.stored {
				want[fmt.Sprintf("%d/%s/%s/%x/%x", region, e.cf, e.op, e.key, e.value)] = e
			}
		}
	}
	for k, e := range want {
		if n := got.entries[k]; n != 1 {
			t.Errorf("event %s (table %d) stored %d times, want once", k, e.table, n)
		}
	}
	for k, n := range got.entries {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected entry %s (%d times)", k, n)
		}
	}
	if got.checkpoint < resolved {
		t.Errorf("global_checkpoint object holds %d, want >= %d", got.checkpoint, resolved)
	}
	if got.tables[3] || !got.tables[1] || !got.tables[2] {
		t.Errorf("chunks of tables %v, want 1 and 2", got.tables)
	}
	if got.compression[compression] == 0 || len(got.compression) != 1 {
		t.Errorf("chunk compressions %v, want only %s", got.compression, compression)
	}
	// Every valid record's offset is inside a meta's [from, to).
	for off, r := range recs {
		if r.valid && !got.covers(int64(off)) {
			t.Errorf("offset %d of a valid record is in no meta's offsets %v", off, got.offsets)
		}
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}

// waitRawCheckpoint reads the flow's id and checkpoint_ts straight from the
// Redis keys of DESIGN 4 until the checkpoint reaches ts.
func waitRawCheckpoint(ctx context.Context, t *testing.T, rdb *redis.Client, flow string, ts uint64) uint64 {
	t.Helper()
	var id uint64
	waitFor(t, 45*time.Second, func() (bool, string) {
		if id == 0 {
			v, err := rdb.Get(ctx, "flowlog:{flowlog}:flow:name:default:"+flow).Uint64()
			if err != nil {
				return false, fmt.Sprintf("flow %s: %v", flow, err)
			}
			id = v
		}
		v, err := rdb.HGet(ctx, fmt.Sprintf("flowlog:{flowlog}:flow:state:%d", id), "checkpoint_ts").Uint64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return false, err.Error()
		}
		return v >= ts, fmt.Sprintf("flow %s checkpoint_ts %d, want >= %d", flow, v, ts)
	})
	return id
}

// jsonReader reads a flow's backup as a restore tool written from DESIGN 6
// alone would: the manifest from Redis, the meta JSON as untyped JSON, the
// chunks by range reads with the storage client, zstd and framing by hand.
// It fails the test on anything that deviates from the documented format.
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
	for _, p := range paths {
		r.readMeta(p, &b)
	}
	ck := r.object(fmt.Sprintf("%s/%s/v1/global_checkpoint/flowlog.ts", r.catalog, r.flow), 0, -1)
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

func (r *jsonReader) readMeta(path string, b *jsonBackup) {
	r.t.Helper()
	dec := json.NewDecoder(bytes.NewReader(r.object(path, 0, -1)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		r.t.Fatalf("meta %s: %v", path, err)
	}
	f := fields{t: r.t, where: path, m: m}
	if v := f.uint("version"); v != 1 {
		r.t.Fatalf("meta %s: version %d", path, v)
	}
	cycle := f.str("cycle_id")
	if f.str("flow") != r.flow || f.uint("flow_id") != r.flowID || f.str("store_id") == "" || cycle == "" {
		r.t.Errorf("meta %s: flow %q flow_id %d store_id %q cycle_id %q", path, m["flow"], m["flow_id"], m["store_id"], cycle)
	}
	minTS, maxTS, minResolved := f.uint("min_ts"), f.uint("max_ts"), f.uint("min_resolved_ts")
	if want := fmt.Sprintf("%s/%s/v1/backupmeta/%020d-%s.meta", r.catalog, r.flow, minResolved, cycle); path != want {
		r.t.Errorf("meta path %s, want %s", path, want)
	}
	phys := time.UnixMilli(int64(minTS >> 18)).UTC()
	dataPath := f.str("data_path")
	if want := fmt.Sprintf("%s/%s/v1/%s/%s/%d-%s.log", r.catalog, r.flow, phys.Format("20060102"), phys.Format("15"), minTS, cycle); dataPath != want {
		r.t.Errorf("meta %s: data_path %s, want %s", path, dataPath, want)
	}
	for _, o := range f.list("offsets") {
		of := fields{t: r.t, where: path + " offsets", m: o}
		if of.str("topic") != testenv.ApplyTopic || of.uint("partition") != 0 || of.uint("from") > of.uint("to") {
			r.t.Errorf("meta %s: offsets entry %v", path, o)
		}
		b.offsets = append(b.offsets, [2]int64{int64(of.uint("from")), int64(of.uint("to"))})
	}
	files := f.list("files")
	if len(files) == 0 {
		r.t.Errorf("meta %s lists no files", path)
	}
	fMin, fMax, fRes := ^uint64(0), uint64(0), ^uint64(0)
	for i, fm := range files {
		ff := fields{t: r.t, where: fmt.Sprintf("%s file %d", path, i), m: fm}
		r.readChunk(dataPath, ff, b)
		fMin, fMax, fRes = min(fMin, ff.uint("min_ts")), max(fMax, ff.uint("max_ts")), min(fRes, ff.uint("resolved_ts"))
	}
	if fMin != minTS || fMax != maxTS || fRes != minResolved {
		r.t.Errorf("meta %s: min_ts %d max_ts %d min_resolved_ts %d; its files give %d %d %d", path, minTS, maxTS, minResolved, fMin, fMax, fRes)
	}
}

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
	b.compression[comp]++
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
		b.entries[fmt.Sprintf("%d/%s/%s/%x/%x", region, cf, op, key, value)]++
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
