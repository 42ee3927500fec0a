package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/api/iterator"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// The oracle of the reliability scenarios: after the final checkpoint,
// `consumer restore` equals the state computed independently from the
// produced data (loadgen.Expected), `consumer verify` is clean, and no Kafka
// offset range or KV entry is referenced twice.

// oracleReport is what oracleCheck found, for the test log and the report.
type oracleReport struct {
	checkpoint     uint64
	restoredKeys   int // keys restore wrote, over the covered tables
	expectedKeys   int
	metas, chunks  int
	entries        int // KV entries in referenced chunks
	wantEntries    int // non-lock events of covered tables the loads produced
	dupEntries     int // entries found in more than one place
	offsetOverlaps int // referenced offset ranges overlapping another
	unreferenced   int // GCS objects that no referenced meta names
}

func (r oracleReport) String() string {
	return fmt.Sprintf("checkpoint %d: restored %d keys (expected %d); %d metas, %d chunks, %d entries (expected %d); "+
		"%d duplicate entries, %d overlapping offset ranges, %d unreferenced objects",
		r.checkpoint, r.restoredKeys, r.expectedKeys, r.metas, r.chunks, r.entries, r.wantEntries,
		r.dupEntries, r.offsetOverlaps, r.unreferenced)
}

// oracleCheck checks flow name after its checkpoint reached the max
// resolved ts of loads: restore at the checkpoint equals the expected state
// of tables, verify exits 0, and the referenced metas hold every produced
// event of tables exactly once. Failures are reported with t.Errorf.
func oracleCheck(t testing.TB, c *cluster, name string, tables []int64, loads ...loadgen.Config) oracleReport {
	t.Helper()
	var rep oracleReport
	var muts []loadgen.Mutation
	var maxResolved uint64
	covered := map[int64]bool{}
	for _, tb := range tables {
		covered[tb] = true
	}
	for _, cfg := range loads {
		muts = append(muts, loadgen.Mutations(cfg)...)
		want := expectedEvents(cfg, covered)
		rep.wantEntries += want.total
		maxResolved = max(maxResolved, want.maxResolved)
	}
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	id, ckpt := waitFlowCheckpointTS(context.Background(), t, store, name, maxResolved, 60*time.Second)
	rep.checkpoint = ckpt

	// 1. restore == expected.
	out := t.TempDir()
	if res := oracleRun(t, "restore", c.oracleConn(), "--flow", name, "--ts", strconv.FormatUint(ckpt, 10), "--out", out,
		"--temp-dir", t.TempDir()); res.code != 0 {
		t.Fatalf("consumer restore exited %d:\n%s", res.code, res.out)
	}
	want := loadgen.Expected(muts, ckpt)
	for _, tb := range tables {
		got := oracleReadRestore(t, filepath.Join(out, strconv.FormatInt(tb, 10)+".jsonl"))
		rep.restoredKeys += len(got)
		rep.expectedKeys += len(want[tb])
		bad := 0
		for k, w := range want[tb] {
			g, ok := got[k]
			switch {
			case !ok:
				bad++
				if bad <= 5 {
					t.Errorf("table %d: key %x missing from restore", tb, k)
				}
			case !bytes.Equal(g.Value, w.Value) || g.CommitTS != w.CommitTS:
				bad++
				if bad <= 5 {
					t.Errorf("table %d: key %x restored at commit ts %d (%d value bytes), want %d (%d bytes)",
						tb, k, g.CommitTS, len(g.Value), w.CommitTS, len(w.Value))
				}
			}
		}
		for k := range got {
			if _, ok := want[tb][k]; !ok {
				if bad++; bad <= 5 {
					t.Errorf("table %d: restore has key %x that should not be live", tb, k)
				}
			}
		}
		if bad > 0 {
			t.Errorf("table %d: %d keys differ (restored %d, expected %d)", tb, bad, len(got), len(want[tb]))
		}
	}

	// 2. verify is clean.
	if res := oracleRun(t, "verify", c.oracleConn(), "--flow", name); res.code != 0 {
		t.Errorf("consumer verify exited %d:\n%s", res.code, res.out)
	}

	// 3. nothing referenced twice.
	oracleScan(t, c, store, id, &rep)
	if rep.dupEntries > 0 || rep.offsetOverlaps > 0 {
		t.Errorf("%d entries referenced more than once, %d overlapping offset ranges", rep.dupEntries, rep.offsetOverlaps)
	}
	if rep.entries != rep.wantEntries {
		t.Errorf("referenced chunks hold %d entries, the loads produced %d for tables %v", rep.entries, rep.wantEntries, tables)
	}
	return rep
}

// oracleScan reads every meta of metas:<id> and every chunk of the flow
// they list (in a layout v2 meta, the chunks that hold it: sink.Meta.Holds),
// and counts entries, duplicate entries, overlapping offset ranges and the
// bucket's data and meta objects that no referenced meta names (a layout v2
// cycle counts as referenced when any flow lists its meta; catalogs and
// checkpoint objects are never counted).
func oracleScan(t testing.TB, c *cluster, store *meta.Store, id meta.FlowID, rep *oracleReport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatalf("gcs bucket: %v", err)
	}
	defer b.Close()
	refs, err := store.Metas(ctx, id)
	if err != nil {
		t.Fatalf("metas of flow %d: %v", id, err)
	}
	referenced := map[string]bool{}
	listedUnits := map[string]bool{} // layout v2 cycles some flow lists
	listed, err := store.References(ctx)
	if err != nil {
		t.Fatalf("listed metas: %v", err)
	}
	for _, p := range listed.Metas {
		if unit, _, ok := sink.V2Unit("", p); ok {
			listedUnits[unit] = true
		}
	}
	type span struct{ from, to int64 }
	ranges := map[string][]span{}
	seen := map[string]int{}
	for _, ref := range refs {
		m := oracleMeta(ctx, t, b, ref.Path)
		if !m.Serves(id) {
			t.Errorf("meta %s listed under flow %d does not serve it", ref.Path, id)
		}
		referenced[ref.Path], referenced[m.DataPath] = true, true
		rep.metas++
		for _, o := range m.Offsets {
			if o.To > o.From {
				k := o.Topic + "/" + strconv.Itoa(int(o.Partition))
				ranges[k] = append(ranges[k], span{o.From, o.To})
			}
		}
		for i, f := range m.Files {
			if !m.Holds(id, &f) {
				continue
			}
			framed, err := sink.ReadChunk(ctx, b, m.DataPath, f)
			if err != nil {
				t.Fatalf("chunk %d of %s: %v", i, m.DataPath, err)
			}
			rep.chunks++
			for rest := framed; len(rest) > 0; {
				var k, v []byte
				if k, v, rest, err = event.NextEntry(rest); err != nil {
					t.Fatalf("chunk %d of %s: %v", i, m.DataPath, err)
				}
				rep.entries++
				ek := string(k) + "\x00" + string(v)
				if seen[ek]++; seen[ek] == 2 {
					rep.dupEntries++
					if rep.dupEntries <= 5 {
						t.Errorf("entry key %x (%d value bytes) in more than one place (second in %s chunk %d)", k, len(v), m.DataPath, i)
					}
				}
			}
		}
	}
	for k, rs := range ranges {
		sort.Slice(rs, func(i, j int) bool { return rs[i].from < rs[j].from })
		for i := 1; i < len(rs); i++ {
			if rs[i].from < rs[i-1].to {
				rep.offsetOverlaps++
				t.Errorf("%s: offset ranges [%d,%d) and [%d,%d) overlap", k, rs[i-1].from, rs[i-1].to, rs[i].from, rs[i].to)
			}
		}
	}
	it := c.GCS.Client.Bucket(c.GCS.Bucket).Objects(ctx, nil)
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatalf("list objects: %v", err)
		}
		if unit, _, ok := sink.V2Unit("", a.Name); ok && listedUnits[unit] {
			continue
		}
		if !referenced[a.Name] && !strings.Contains(a.Name, "/global_checkpoint/") && !strings.Contains(a.Name, "/catalog/") {
			rep.unreferenced++
		}
	}
}

// oracleMeta reads and decodes the meta object at path.
func oracleMeta(ctx context.Context, t testing.TB, b sink.Bucket, path string) sink.Meta {
	t.Helper()
	r, err := b.Get(ctx, path)
	if err != nil {
		t.Fatalf("get meta %s: %v", path, err)
	}
	defer r.Close()
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read meta %s: %v", path, err)
	}
	m, err := sink.DecodeMeta(raw)
	if err != nil {
		t.Fatalf("decode meta %s: %v", path, err)
	}
	return m
}

// oracleReadRestore reads one <table>.jsonl of `consumer restore`; a missing
// file is an empty table.
func oracleReadRestore(t testing.TB, path string) map[string]loadgen.Row {
	t.Helper()
	out := map[string]loadgen.Row{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return out
	} else if err != nil {
		t.Fatalf("restore output: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	prev := ""
	for sc.Scan() {
		var line struct {
			Key      string `json:"key"`
			Value    string `json:"value"`
			CommitTS uint64 `json:"commit_ts"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		k, err := hex.DecodeString(line.Key)
		if err != nil {
			t.Fatalf("%s: key %q: %v", path, line.Key, err)
		}
		v, err := base64.StdEncoding.DecodeString(line.Value)
		if err != nil {
			t.Fatalf("%s: value: %v", path, err)
		}
		if string(k) <= prev && prev != "" {
			t.Errorf("%s: key %x not after %x", path, k, prev)
		}
		if _, dup := out[string(k)]; dup {
			t.Errorf("%s: key %x twice", path, k)
		}
		prev = string(k)
		out[string(k)] = loadgen.Row{Value: v, CommitTS: line.CommitTS}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// oracleConn is the connection flags of the consumer's operator commands
// that read the backup (restore, verify, ...: no Kafka).
func (c *cluster) oracleConn() []string {
	return []string{"--redis-url", c.Redis.URL, "--gcs-bucket", c.GCS.Bucket,
		"--gcs-endpoint", c.GCS.Addr, "--group", "flowlog"}
}

// oracleResult is the exit code and combined output of a command.
type oracleResult struct {
	code int
	out  string
}

// oracleRun runs `consumer <sub> <conn...> <args...>` to completion.
func oracleRun(t testing.TB, sub string, conn []string, args ...string) oracleResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t, "consumer"), append(append([]string{sub}, conn...), args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return oracleResult{0, out.String()}
	case errors.As(err, &ee):
		return oracleResult{ee.ExitCode(), out.String()}
	default:
		t.Fatalf("consumer %s: %v\n%s", sub, err, out.String())
		return oracleResult{}
	}
}
