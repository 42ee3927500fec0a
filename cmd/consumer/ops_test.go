package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// opsEnv is a flow "default/f" (id 1) on tables 1 and 2 with two committed
// cycles in GCS, checkpointed at 300.
type opsEnv struct {
	redis *testenv.Redis
	gcs   *testenv.GCS
	store *meta.Store
	kafka *testenv.Kafka
	metas []sink.Meta
	conn  []string
}

const opsCheckpoint = 300

func newOpsEnv(t *testing.T) *opsEnv {
	ctx := context.Background()
	e := &opsEnv{redis: testenv.StartRedis(t), gcs: testenv.StartGCS(t), kafka: testenv.StartKafka(t, 2)}
	e.store = meta.NewStore(e.redis.Client(t), "flowlog", nil)
	e.conn = []string{"--redis-url", e.redis.URL, "--gcs-endpoint", e.gcs.Endpoint(), "--gcs-bucket", testenv.Bucket,
		"--gcs-prefix", "pre", "--group", "g1"}
	info := meta.FlowInfo{CatalogName: "default", FlowName: "f", SourceTableIDs: []uint32{1, 2},
		SinkTableName: meta.TableName{CatalogName: "default", SchemaName: "public", TableName: "out"}, FlownodeIDs: map[uint32]uint64{0: 1}}
	if err := e.store.CreateFlow(ctx, 1, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		t.Fatal(err)
	}
	b, err := gcs.New(ctx, gcs.Config{Bucket: testenv.Bucket, Endpoint: e.gcs.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	big := []byte(strings.Repeat("big value ", 40))
	cycles := []sinktest.Cycle{
		{Entries: []sinktest.Entry{
			sinktest.WritePut(1, 1, 100, 101, []byte("one"), true),
			sinktest.DefaultPut(1, 2, 102, big),
			sinktest.WritePut(1, 2, 102, 103, big, false),
			sinktest.WritePut(2, 9, 104, 105, []byte("nine"), true),
		}, Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: 0, To: 4}}, ResolvedTS: 150},
		{Entries: []sinktest.Entry{
			sinktest.WriteRecord(1, 1, 201, event.Write{Type: event.WriteDelete, StartTS: 200}),
			sinktest.WritePut(2, 9, 202, 203, []byte("nine-2"), true),
			sinktest.WritePut(2, 10, 400, 401, []byte("after checkpoint"), true),
		}, Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: 4, To: 7}}, ResolvedTS: 300, Compression: "zstd"},
	}
	lease, err := e.store.AcquireLease(ctx, "flowlog.apply", 0, "member-1")
	if err != nil {
		t.Fatal(err)
	}
	backuptest.OpenWindows(t, e.store, lease)
	for i, c := range cycles {
		c.Prefix, c.Catalog, c.Flow, c.FlowID, c.CycleID = "pre", "default", "f", 1, fmt.Sprintf("c%d", i)
		m, path := sinktest.WriteCycle(t, b, c)
		e.metas = append(e.metas, m)
		err := e.store.Commit(ctx, meta.Commit{
			Leases:     []meta.Lease{lease},
			Partitions: []meta.PartitionCommit{{Topic: "flowlog.apply", Partition: 0, NextOffset: c.Offsets[0].To, Checkpoint: c.ResolvedTS, HasCheckpoint: true}},
			Metas:      []meta.MetaRef{{FlowID: 1, Path: path, MinResolvedTS: c.ResolvedTS}},
			Flows:      []meta.FlowID{1}, LastFlushTS: c.ResolvedTS,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.store.AdvanceCheckpoint(ctx, 1, opsCheckpoint); err != nil {
		t.Fatal(err)
	}
	cp := sink.EncodeCheckpoint(opsCheckpoint)
	if err := b.Upload(ctx, sink.Object{Name: sink.CheckpointPath("pre", "default", "f", "g1", 1), Body: strings.NewReader(string(cp)), Size: 8, CRC32C: sink.CRC32C(cp)}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *opsEnv) args(extra ...string) []string {
	return append(append([]string{}, e.conn...), extra...)
}

func TestRestoreVerifyCommands(t *testing.T) {
	e := newOpsEnv(t)
	ctx := context.Background()

	for _, tc := range []struct {
		name   string
		args   []string
		tables map[string][]string
		errSub string
	}{
		{"at checkpoint", nil, map[string][]string{
			"1": {backuptest.RowHex(1, 2) + "=big value bi@103"},
			"2": {backuptest.RowHex(2, 9) + "=nine-2@203"},
		}, ""},
		{"earlier ts", []string{"--ts", "150"}, map[string][]string{
			"1": {backuptest.RowHex(1, 1) + "=one@101", backuptest.RowHex(1, 2) + "=big value bi@103"},
			"2": {backuptest.RowHex(2, 9) + "=nine@105"},
		}, ""},
		{"one table", []string{"--ts", "150", "--tables", "2"}, map[string][]string{"2": {backuptest.RowHex(2, 9) + "=nine@105"}}, ""},
		{"key range", []string{"--ts", "150", "--start-key", backuptest.RowHex(1, 2), "--end-key", backuptest.RowHex(2, 9)}, map[string][]string{
			"1": {backuptest.RowHex(1, 2) + "=big value bi@103"},
			"2": {}, // the range ends before the table's only row
		}, ""},
		{"key range of one table", []string{"--start-key", backuptest.RowHex(2, 0)}, map[string][]string{"2": {backuptest.RowHex(2, 9) + "=nine-2@203"}}, ""},
		{"past checkpoint", []string{"--ts", "301"}, nil, "past the flow's checkpoint 300"},
		{"unknown flow", []string{"--flow", "nope"}, nil, "no flow default/nope"},
		{"dropped id unknown", []string{"--flow-id", "77"}, nil, "no such flow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			args := e.args("--out", out, "--temp-dir", t.TempDir())
			if !strings.Contains(strings.Join(tc.args, " "), "--flow") {
				args = append(args, "--flow", "f")
			}
			stdout, err := capture(t, func() error { return runRestore(ctx, append(args, tc.args...)) })
			if tc.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSub) {
					t.Fatalf("restore = %v, want error containing %q", err, tc.errSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(stdout, "MiB/s") {
				t.Errorf("no throughput line in %q", stdout)
			}
			files, _ := filepath.Glob(filepath.Join(out, "*.jsonl"))
			if len(files) != len(tc.tables) {
				t.Fatalf("files %v, want tables %v", files, tc.tables)
			}
			for table, want := range tc.tables {
				got := backuptest.ReadTable(t, filepath.Join(out, table+".jsonl"))
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("table %s:\n got %v\nwant %v", table, got, want)
				}
			}
		})
	}

	t.Run("verify clean", func(t *testing.T) {
		stdout, err := capture(t, func() error { return runVerify(ctx, e.args("--flow", "default/f", "--json")) })
		if err != nil {
			t.Fatalf("verify: %v\n%s", err, stdout)
		}
		var rep struct {
			OK     bool     `json:"ok"`
			Chunks int      `json:"chunks"`
			Faults []string `json:"faults"`
		}
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("%v: %s", err, stdout)
		}
		if !rep.OK || rep.Chunks != 5 || len(rep.Faults) != 0 {
			t.Fatalf("report %+v", rep)
		}
	})

	t.Run("flows", func(t *testing.T) {
		stdout, err := capture(t, func() error { return runFlows(ctx, e.args()) })
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stdout, "default/f") || !strings.Contains(stdout, "1,2") || !strings.Contains(stdout, " 300 ") {
			t.Fatalf("flows output lacks the flow:\n%s", stdout)
		}
	})

	t.Run("status", func(t *testing.T) {
		cl := e.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
		for range 9 {
			if err := cl.ProduceSync(ctx, newRecord("flowlog.apply", 0)).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		stdout, err := capture(t, func() error {
			return runStatus(ctx, e.args("--brokers", e.kafka.Brokers(), "--http-addr", "", "--json"))
		})
		if err != nil {
			t.Fatal(err)
		}
		var rep statusReport
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("%v: %s", err, stdout)
		}
		if len(rep.Partitions) != 2 || len(rep.Flows) != 1 {
			t.Fatalf("status %+v", rep)
		}
		p0 := rep.Partitions[0]
		if p0.LeaseHolder != "member-1" || p0.Offset != 7 || p0.EndOffset != 9 || p0.Lag != 2 || p0.CheckpointTS != 300 {
			t.Fatalf("partition 0: %+v", p0)
		}
		if p1 := rep.Partitions[1]; p1.Offset != -1 || p1.LeaseHolder != "" {
			t.Fatalf("partition 1: %+v", p1)
		}
	})

	t.Run("corrupt chunk", func(t *testing.T) {
		m := e.metas[0]
		obj, err := e.gcs.GetObject(testenv.Bucket, m.DataPath)
		if err != nil {
			t.Fatal(err)
		}
		content := append([]byte{}, obj.Content...)
		content[m.Files[1].Offset+5] ^= 0x20
		e.gcs.CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: testenv.Bucket, Name: m.DataPath}, Content: content})
		t.Cleanup(func() {
			e.gcs.CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: testenv.Bucket, Name: m.DataPath}, Content: obj.Content})
		})

		stdout, err := capture(t, func() error { return runVerify(ctx, e.args("--flow", "f")) })
		var exit exitError
		if !errors.As(err, &exit) || exit.code != 1 {
			t.Fatalf("verify = %v, want exit code 1", err)
		}
		if !strings.Contains(stdout, "FAULT") || !strings.Contains(stdout, m.DataPath) || !strings.Contains(stdout, "chunk 1 ") {
			t.Fatalf("verify output does not name object and chunk:\n%s", stdout)
		}
		_, err = capture(t, func() error { return runRestore(ctx, e.args("--flow", "f", "--out", t.TempDir())) })
		var ce *sink.ChecksumError
		if !errors.As(err, &ce) || ce.Object != m.DataPath || ce.Chunk != 1 {
			t.Fatalf("restore = %v, want checksum error of chunk 1 of %s", err, m.DataPath)
		}
	})

	t.Run("dropped flow by id", func(t *testing.T) {
		info, _, err := e.store.FlowInfo(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.store.DestroyFlow(ctx, 1, info); err != nil {
			t.Fatal(err)
		}
		out := t.TempDir()
		if _, err := capture(t, func() error { return runRestore(ctx, e.args("--flow-id", "1", "--out", out)) }); err != nil {
			t.Fatal(err)
		}
		if got := backuptest.ReadTable(t, filepath.Join(out, "2.jsonl")); fmt.Sprint(got) != fmt.Sprint([]string{backuptest.RowHex(2, 9) + "=nine-2@203"}) {
			t.Fatalf("table 2 of dropped flow: %v", got)
		}
		if _, err := capture(t, func() error { return runVerify(ctx, e.args("--flow-id", "1")) }); err != nil {
			t.Fatalf("verify dropped flow: %v", err)
		}
		if err := runRestore(ctx, e.args("--flow", "f", "--out", out)); err == nil {
			t.Fatal("restore by name of a dropped flow succeeded")
		}
	})
}

func newRecord(topic string, partition int32) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: partition, Value: []byte("x")}
}
