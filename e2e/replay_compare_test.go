package e2e

import (
	"bytes"
	"context"
	binenc "encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
)

// Comparisons of the replay tests: restore outputs byte for byte, and
// replayed topics record for record.

// restoreAt runs `consumer restore` of flow with conn as of ts into a new
// directory and returns it, failing the test on a non-zero exit.
func restoreAt(t *testing.T, conn []string, flow string, ts uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "restore-"+strconv.FormatUint(ts, 10))
	res := oracleRun(t, "restore", conn, "--flow", flow, "--ts", strconv.FormatUint(ts, 10), "--out", dir, "--temp-dir", t.TempDir())
	if res.code != 0 {
		t.Fatalf("restore of %s as of %d exited %d:\n%s", flow, ts, res.code, res.out)
	}
	return dir
}

// diffRestores compares two restore outputs byte for byte and describes the
// first difference, naming the table and, for a row key, the row: "" when
// they are the same.
func diffRestores(want, got string) (string, error) {
	wantFiles, err := restoreFiles(want)
	if err != nil {
		return "", err
	}
	gotFiles, err := restoreFiles(got)
	if err != nil {
		return "", err
	}
	if !slices.Equal(wantFiles, gotFiles) {
		return fmt.Sprintf("the original's restore wrote %v, the replayed one's %v", wantFiles, gotFiles), nil
	}
	for _, name := range wantFiles {
		w, err := os.ReadFile(filepath.Join(want, name))
		if err != nil {
			return "", err
		}
		g, err := os.ReadFile(filepath.Join(got, name))
		if err != nil {
			return "", err
		}
		if !bytes.Equal(w, g) {
			return diffTable(strings.TrimSuffix(name, ".jsonl"), w, g), nil
		}
	}
	return "", nil
}

// restoreFiles are the names of the files of a restore's output, sorted.
func restoreFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("restore output: %w", err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, nil
}

// diffTable describes the first line where two <table>.jsonl files differ.
func diffTable(table string, want, got []byte) string {
	wl, gl := bytes.SplitAfter(want, []byte("\n")), bytes.SplitAfter(got, []byte("\n"))
	for i := 0; i < max(len(wl), len(gl)); i++ {
		var w, g []byte
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if bytes.Equal(w, g) {
			continue
		}
		wk, gk := lineKey(w), lineKey(g)
		switch {
		case len(g) == 0 || wk != "" && gk != "" && wk < gk:
			return fmt.Sprintf("table %s: %s (line %d) is missing from the replayed backup's restore: original %s",
				table, rowName(wk), i+1, clip(w))
		case len(w) == 0 || wk != "" && gk != "" && gk < wk:
			return fmt.Sprintf("table %s: %s (line %d) is only in the replayed backup's restore: %s",
				table, rowName(gk), i+1, clip(g))
		default:
			return fmt.Sprintf("table %s: %s (line %d) differs: original %s, replayed %s", table, rowName(wk), i+1, clip(w), clip(g))
		}
	}
	return fmt.Sprintf("table %s: the files differ in bytes but not in lines", table)
}

// lineKey is the hex key of a restore line, "" if it has none.
func lineKey(line []byte) string {
	var l struct {
		Key string `json:"key"`
	}
	if json.Unmarshal(line, &l) != nil {
		return ""
	}
	return l.Key
}

// rowName names a raw key given in hex: "row <handle>" for a row key of
// docs/FORMAT.md's "Keys and timestamps", else "key <hex>".
func rowName(hexKey string) string {
	raw, err := hex.DecodeString(hexKey)
	if err == nil && len(raw) == 19 && raw[0] == 't' && raw[9] == '_' && raw[10] == 'r' {
		return fmt.Sprintf("row %d", int64(binenc.BigEndian.Uint64(raw[11:])^1<<63))
	}
	return "key " + hexKey
}

func clip(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

// createTopics creates topics of partitions partitions each on the broker
// at brokers and waits until they are there.
func createTopics(t *testing.T, brokers string, partitions int32, topics ...string) {
	t.Helper()
	adm := newAdmin(t, brokers)
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.CreateTopics(ctx, partitions, 1, nil, topics...)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("create topics %v: %v", topics, err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		m, err := adm.Metadata(ctx, topics...)
		if err != nil {
			return false, err.Error()
		}
		for _, tp := range topics {
			d, ok := m.Topics[tp]
			if !ok || d.Err != nil || int32(len(d.Partitions)) != partitions {
				return false, fmt.Sprintf("topic %s not there yet", tp)
			}
			for _, p := range d.Partitions {
				if p.Err != nil || p.Leader < 0 {
					return false, fmt.Sprintf("topic %s partition %d has no leader", tp, p.Partition)
				}
			}
		}
		return true, ""
	})
}

// Headers of a replayed record (docs/FORMAT.md, "Replay records").
const (
	headerReplay    = "flowlog-replay"
	headerReplaySeq = "flowlog-replay-seq"
)

// replayedRecord is a record of a replayed topic, decoded.
type replayedRecord struct {
	*kgo.Record
	run   string
	seq   uint64
	batch event.Batch
}

// readReplayed reads topic whole and decodes every record, failing the
// test on a record without the replay headers or with a value that does
// not decode; it returns the records by partition, in offset order.
func readReplayed(t *testing.T, brokers, topic string) map[int32][]replayedRecord {
	t.Helper()
	adm := newAdmin(t, brokers)
	defer adm.Close()
	out := map[int32][]replayedRecord{}
	for _, r := range churnReadTopic(context.Background(), t, adm, brokers, topic) {
		rr := replayedRecord{Record: r}
		var seq string
		for _, h := range r.Headers {
			switch h.Key {
			case headerReplay:
				rr.run = string(h.Value)
			case headerReplaySeq:
				seq = string(h.Value)
			}
		}
		n, err := strconv.ParseUint(seq, 10, 64)
		if rr.run == "" || err != nil {
			t.Fatalf("%s: record at %d/%d has headers %s=%q and %s=%q", topic, r.Partition, r.Offset, headerReplay, rr.run, headerReplaySeq, seq)
		}
		rr.seq = n
		if err := event.DecodeBatch(&rr.batch, r.Value, event.ContentType(r)); err != nil {
			t.Fatalf("%s: record at %d/%d: %v", topic, r.Partition, r.Offset, err)
		}
		if string(r.Key) != strconv.FormatUint(rr.batch.RegionID, 10) {
			t.Fatalf("%s: record at %d/%d has key %q for region %d", topic, r.Partition, r.Offset, r.Key, rr.batch.RegionID)
		}
		out[r.Partition] = append(out[r.Partition], rr)
	}
	for p, rs := range out {
		slices.SortFunc(rs, func(a, b replayedRecord) int { return int(a.Offset - b.Offset) })
		out[p] = rs
	}
	return out
}

// diffTopics compares two replayed topics record for record (partition,
// order, key, value, headers) and describes the first difference.
func diffTopics(want, got map[int32][]replayedRecord) string {
	parts := map[int32]bool{}
	for p := range want {
		parts[p] = true
	}
	for p := range got {
		parts[p] = true
	}
	for _, p := range slices.Sorted(func(yield func(int32) bool) {
		for p := range parts {
			if !yield(p) {
				return
			}
		}
	}) {
		w, g := want[p], got[p]
		for i := range max(len(w), len(g)) {
			switch {
			case i >= len(w):
				return fmt.Sprintf("partition %d: %d records, want %d; the first extra one is region %d's seq %d", p, len(g), len(w), g[i].batch.RegionID, g[i].seq)
			case i >= len(g):
				return fmt.Sprintf("partition %d: %d records, want %d; the first missing one is region %d's seq %d", p, len(g), len(w), w[i].batch.RegionID, w[i].seq)
			}
			if d := diffRecord(w[i].Record, g[i].Record); d != "" {
				return fmt.Sprintf("partition %d record %d (offset %d, want region %d's seq %d): %s", p, i, g[i].Offset, w[i].batch.RegionID, w[i].seq, d)
			}
		}
	}
	return ""
}

// diffRecord describes how two records' keys, values and headers differ.
func diffRecord(want, got *kgo.Record) string {
	switch {
	case !bytes.Equal(want.Key, got.Key):
		return fmt.Sprintf("key %q, want %q", got.Key, want.Key)
	case !bytes.Equal(want.Value, got.Value):
		return fmt.Sprintf("value of %d bytes differs from the wanted %d bytes", len(got.Value), len(want.Value))
	case len(want.Headers) != len(got.Headers):
		return fmt.Sprintf("headers %s, want %s", headerText(got.Headers), headerText(want.Headers))
	}
	for i := range want.Headers {
		if want.Headers[i].Key != got.Headers[i].Key || !bytes.Equal(want.Headers[i].Value, got.Headers[i].Value) {
			return fmt.Sprintf("headers %s, want %s", headerText(got.Headers), headerText(want.Headers))
		}
	}
	return ""
}

func headerText(hs []kgo.RecordHeader) string {
	var s []string
	for _, h := range hs {
		s = append(s, h.Key+"="+strconv.Quote(string(h.Value)))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// replayCount is the number of records of a replayed topic.
func replayCount(rs map[int32][]replayedRecord) int {
	n := 0
	for _, p := range rs {
		n += len(p)
	}
	return n
}

// checkReplayedOnce checks that every record of a replayed topic is there
// once by its sequence number and in order: within each partition the
// sequence numbers of one run rise, and each region's batches keep resolved
// ts that never go back. It returns the first problem.
func checkReplayedOnce(rs map[int32][]replayedRecord) error {
	seen := map[string]string{} // run/seq -> where
	var errs []error
	for p, recs := range rs {
		last := map[string]uint64{}
		resolved := map[uint64]uint64{}
		for _, r := range recs {
			where := fmt.Sprintf("%d/%d", p, r.Offset)
			id := r.run + "/" + strconv.FormatUint(r.seq, 10)
			if at, dup := seen[id]; dup {
				errs = append(errs, fmt.Errorf("run %q seq %d at %s and again at %s", r.run, r.seq, at, where))
			}
			seen[id] = where
			if prev, ok := last[r.run]; ok && r.seq <= prev {
				errs = append(errs, fmt.Errorf("run %q seq %d at %s after seq %d", r.run, r.seq, where, prev))
			}
			last[r.run] = r.seq
			region := r.batch.RegionID
			if r.batch.ResolvedTS < resolved[region] {
				errs = append(errs, fmt.Errorf("region %d's resolved ts goes back from %d to %d at %s", region, resolved[region], r.batch.ResolvedTS, where))
			}
			resolved[region] = max(resolved[region], r.batch.ResolvedTS)
			if len(errs) >= 5 {
				return errors.Join(errs...)
			}
		}
	}
	return errors.Join(errs...)
}

// TestDiffRestores checks the restore comparison without services: it
// names the table and row of the first line that differs.
func TestDiffRestores(t *testing.T) {
	line := func(handle int64, v string, ts int) string {
		return fmt.Sprintf(`{"key":"%x","value":"%s","commit_ts":%d}`+"\n", event.RowKey(3, handle), v, ts)
	}
	base := map[string]string{"3.jsonl": line(1, "YQ==", 5) + line(2, "Yg==", 6), "4.jsonl": ""}
	for _, tc := range []struct {
		name string
		got  map[string]string
		want string // a part of the description; "" for none
	}{
		{"same", base, ""},
		{"value", map[string]string{"3.jsonl": line(1, "YQ==", 5) + line(2, "Yw==", 6), "4.jsonl": ""}, "table 3: row 2 (line 2) differs"},
		{"missing row", map[string]string{"3.jsonl": line(2, "Yg==", 6), "4.jsonl": ""}, "table 3: row 1 (line 1) is missing"},
		{"extra row", map[string]string{"3.jsonl": line(1, "YQ==", 5) + line(2, "Yg==", 6) + line(3, "Yg==", 7), "4.jsonl": ""}, "table 3: row 3 (line 3) is only in"},
		{"files", map[string]string{"3.jsonl": base["3.jsonl"]}, "wrote [3.jsonl 4.jsonl], the replayed one's [3.jsonl]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write := func(files map[string]string) string {
				dir := t.TempDir()
				for name, s := range files {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				return dir
			}
			d, err := diffRestores(write(base), write(tc.got))
			if err != nil {
				t.Fatal(err)
			}
			if (d == "") != (tc.want == "") || !strings.Contains(d, tc.want) {
				t.Errorf("diffRestores = %q, want %q", d, tc.want)
			}
		})
	}
}
