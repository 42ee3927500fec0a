package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// Shape of the crafted metas: each just under the 64 MiB meta cap with
// 110,000 file entries, nine of them listed.
const (
	craftedMetas   = 9
	craftedFiles   = 110_000
	craftedKeyHex  = 84 // hex digits of each start_key and end_key: 57 MiB in all
	craftedMaxMem  = 64 << 20
	craftedAllowed = craftedMaxMem + 64<<20
)

// craftedMeta returns a valid meta of flow f (layout v1, or v2 serving
// it and another flow) with craftedFiles files whose chunks lie in a data
// object that does not exist: every reader must go through all of it.
func craftedMeta(t *testing.T, f sink.Flow, v2 bool, cycle string, resolved uint64) (string, []byte) {
	t.Helper()
	key := strings.Repeat("7480", craftedKeyHex/4)
	m := sink.Meta{Version: sink.MetaVersion, Flow: f.Name, FlowID: f.ID, StoreID: "attacker", CycleID: cycle,
		MinTS: 1, MaxTS: resolved, MinResolvedTS: resolved}
	m.DataPath = sink.DataPath(f.Prefix, f.Catalog, f.Name, f.ID, 1, cycle)
	path := sink.MetaPath(f.Prefix, f.Catalog, f.Name, f.ID, resolved, cycle)
	if v2 {
		m.Version, m.Flow, m.FlowID, m.Group = sink.MetaVersion2, "", 0, "flowlog"
		m.Flows = []sink.MetaFlow{{FlowID: f.ID, Catalog: f.Catalog, Name: f.Name}, {FlowID: f.ID + 1, Catalog: f.Catalog, Name: "other"}}
		m.DataPath = sink.DataPathV2(f.Prefix, "attacker", 1, cycle)
		path = sink.MetaPathV2(f.Prefix, "attacker", resolved, cycle)
	}
	m.Files = make([]sink.FileMeta, craftedFiles)
	for i := range m.Files {
		m.Files[i] = sink.FileMeta{Offset: int64(i) * 64, Length: 64, RawLength: 64, Compression: sink.CompressionNone,
			SHA256: strings.Repeat("ab", 32), NumberOfEntries: 1, MinTS: 1, MaxTS: resolved, ResolvedTS: resolved,
			MinBeginTSInDefaultCF: 1, StartKey: key, EndKey: key, TableID: 1, RegionID: uint64(i), CF: sink.CFWrite, Op: sink.OpPut}
		if v2 {
			m.Files[i].FlowIDs = []uint32{f.ID, f.ID + 1}
		}
	}
	raw, err := sink.EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	return path, raw
}

// TestHostileCraftedMetas is the crafted-metas attack: nine listed metas
// of 57 MiB, each with 110,000 file entries, under the 64 MiB meta cap.
// Every operator command that reads them (restore, snapshot, verify, gc
// --dry-run, flows), run as the built binary with --max-memory 64MiB, must
// peak (VmHWM) within it plus 64 MiB, and fail or report rather than
// hang.
func TestHostileCraftedMetas(t *testing.T) {
	c := startCluster(t, 1)
	ctx := context.Background()
	rdb := c.Redis.Client(t)
	store := meta.NewStore(rdb, "flowlog", nil)
	res, err := store.ApplyDDL(ctx, meta.DDL{Op: meta.OpCreate, Flow: meta.FlowInfo{FlowName: "crafted", SourceTableIDs: []uint32{1}}},
		meta.DDLPosition{Topic: testenv.DDLTopic, Partition: 0, NextOffset: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := res.FlowID
	now := event.ComposeTS(time.Now().Add(-time.Minute).UnixMilli(), 0)
	keys := store.Keys()
	if err := rdb.HSet(ctx, keys.Coverage(uint32(id)), "1", `{"since":1,"until":null}`).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, keys.FlowState(id), "checkpoint_ts", strconv.FormatUint(now, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	bucket, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	f := sink.Flow{Catalog: "default", Name: "crafted", ID: uint32(id)}
	var size int
	for i := range craftedMetas {
		path, raw := craftedMeta(t, f, i%2 == 1, fmt.Sprintf("crafted%d", i), now-uint64(craftedMetas-i))
		size = len(raw)
		if err := bucket.Upload(ctx, sink.Object{Name: path, Body: bytes.NewReader(raw), Size: int64(len(raw)), CRC32C: sink.CRC32C(raw)}); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, keys.Metas(uint32(id)), redis.Z{Score: float64(now - uint64(craftedMetas-i)), Member: path}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d metas of %.1f MiB with %d files each listed for flow %d", craftedMetas, float64(size)/(1<<20), craftedFiles, id)

	mem := strconv.Itoa(craftedMaxMem>>20) + "MiB"
	for _, tc := range []struct {
		name string
		args []string
		// fails is what a failing command must say; "" for one that ends
		// well (gc finds every listed object referenced, flows lists the
		// flow).
		fails string
	}{
		{"restore", []string{"restore", "--flow", "crafted", "--out", t.TempDir(), "--temp-dir", t.TempDir(), "--max-memory", mem}, "object does not exist"},
		{"snapshot", []string{"snapshot", "--flow", "crafted", "--temp-dir", t.TempDir(), "--max-memory", mem}, "object does not exist"},
		{"verify", []string{"verify", "--flow", "crafted", "--max-memory", mem}, "is missing"},
		{"gc --dry-run", []string{"gc", "--dry-run", "--grace", "1h", "--max-memory", mem}, ""},
		{"flows", []string{"flows", "--max-memory", mem}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, hwm, err := craftedRun(t, c, tc.args)
			if (err != nil) != (tc.fails != "") || !strings.Contains(out, tc.fails) || tc.fails == "" && !strings.Contains(out, "crafted") {
				t.Errorf("%s: %v, want %s; output:\n%s", tc.name, err, map[bool]string{true: "a failure saying " + tc.fails, false: "success"}[tc.fails != ""], out)
			}
			t.Logf("%s: VmHWM %.1f MiB (allowed %d MiB), %v; last line: %s", tc.name, float64(hwm)/(1<<20), craftedAllowed>>20, err, restoreLastLine(out))
			if hwm > craftedAllowed {
				t.Errorf("%s peaked at %.1f MiB, over --max-memory %s + 64 MiB", tc.name, float64(hwm)/(1<<20), mem)
			}
		})
	}
}

// craftedRun runs the consumer with args and the cluster's connection
// flags, and returns its output, its peak resident set and its exit error.
func craftedRun(t *testing.T, c *cluster, args []string) (string, int64, error) {
	t.Helper()
	return runPeakRSS(t, 5*time.Minute, binary(t, "consumer"), append(append([]string{args[0]}, restoreConnArgs(c)...), args[1:]...)...)
}
