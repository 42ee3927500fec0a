package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	byteorder "encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestJSONFromNonGoClient produces hand-written protojson ApplyBatch records
// with kcat (librdkafka, no flowlog code involved) and reads the backup back
// with jsonReader, a reader of docs/FORMAT.md that shares no code with sink:
// the valid records' table 1 and 2 events are stored exactly once, exactly as
// documented, and the malformed records land in the DLQ with their flowlog-*
// headers.
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

// rowKey is the raw TiKV row key (docs/FORMAT.md, "Keys and timestamps"),
// written out by hand.
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
	long := bytes.Repeat([]byte("kcat-long-value-"), 200) // past tinyChunk: compressed under zstd
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
	delete(got.compression, tinyNone)
	if got.compression[compression] == 0 || len(got.compression) != 1 {
		t.Errorf("chunk compressions %v, want only %s (and chunks of at most %d bytes uncompressed)", got.compression, compression, tinyChunk)
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

// waitRawCheckpoint reads the flow's id and effective checkpoint straight
// from the Redis keys (docs/FORMAT.md, "Redis keys" and "Checkpoint rule":
// the larger of flow:state checkpoint_ts and global_checkpoint) until the
// checkpoint reaches ts.
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
		g, err := rdb.Get(ctx, "flowlog:{flowlog}:global_checkpoint").Uint64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return false, err.Error()
		}
		v = max(v, g)
		return v >= ts, fmt.Sprintf("flow %s checkpoint %d, want >= %d", flow, v, ts)
	})
	return id
}
