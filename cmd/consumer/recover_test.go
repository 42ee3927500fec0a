package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// TestRecoverCommand: `consumer recover` refuses a prefix that holds keys
// (naming --replace-existing) and changes nothing; on the flushed Redis,
// --dry-run prints the plan and writes nothing; a bucket with chunks of a
// flow no catalog describes is refused (naming --allow-incomplete); the
// real run writes the
// plan, owner last, listing the committed metas again and taking the
// group's Kafka offset where it is past what the metas say.
func TestRecoverCommand(t *testing.T) {
	ctx := context.Background()
	rd, g, k := testenv.StartRedis(t), testenv.StartGCS(t), testenv.StartKafka(t, 1)
	e := backuptest.New(t, rd, g, "flowlog", "pre", 1)
	for i := range 3 {
		e.CommitV2(t, e.TS(time.Duration(i+1)*time.Minute), sinktest.WritePut(1, int64(i), e.TS(time.Duration(i)*time.Minute), e.TS(time.Duration(i)*time.Minute+time.Second), []byte("v"), true))
	}
	e.WriteCatalog(t, 1, 1)
	rdb := rd.Client(t)
	metas, err := rdb.ZRange(ctx, "flowlog:{flowlog}:metas:1", 0, -1).Result()
	if err != nil || len(metas) != 3 {
		t.Fatalf("metas before: %v, %v", metas, err)
	}
	// The group committed offset 5 in Kafka: past the 3 records the metas hold.
	cl := k.Client(t)
	if err := kadm.NewClient(cl).CommitAllOffsets(ctx, backuptest.Group, kadm.OffsetsFromRecords(kgo.Record{Topic: testenv.ApplyTopic, Partition: 0, Offset: 4})); err != nil {
		t.Fatal(err)
	}
	args := e.Args("--brokers", k.Brokers(), "--apply-topic", testenv.ApplyTopic, "--ddl-topic", testenv.DDLTopic, "--dlq-topic", testenv.DLQTopic)

	if _, err := capture(t, func() error { return runRecover(ctx, args) }); err == nil || !strings.Contains(err.Error(), "--replace-existing") {
		t.Fatalf("recover over a prefix with keys = %v, want a refusal naming --replace-existing", err)
	}
	if got, _ := rdb.ZRange(ctx, "flowlog:{flowlog}:metas:1", 0, -1).Result(); !slices.Equal(got, metas) {
		t.Fatalf("the refused recover changed metas:1 to %v", got)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	out, err := capture(t, func() error { return runRecover(ctx, append(args, "--dry-run")) })
	if err != nil {
		t.Fatalf("recover --dry-run: %v\n%s", err, out)
	}
	for _, want := range []string{"recovery plan", "metas: 3 in the bucket: 3 chosen", "kafka committed 5 -> offset 5", "dry run: nothing written"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output does not say %q:\n%s", want, out)
		}
	}
	if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
		t.Fatalf("--dry-run wrote %d keys", n)
	}
	// Flow 2 has chunks (every cycle is shared with it) but no catalog:
	// without --allow-incomplete, recover writes nothing.
	if _, err := capture(t, func() error { return runRecover(ctx, args) }); err == nil || !strings.Contains(err.Error(), "--allow-incomplete") {
		t.Fatalf("recover with an uncatalogued flow = %v, want a refusal naming --allow-incomplete", err)
	}
	if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
		t.Fatalf("the refused recover wrote %d keys", n)
	}
	e.WriteCatalog(t, 2, 1) // flow 2 as a dropped flow
	if out, err = capture(t, func() error { return runRecover(ctx, args) }); err != nil {
		t.Fatalf("recover: %v\n%s", err, out)
	}
	if got, _ := rdb.ZRange(ctx, "flowlog:{flowlog}:metas:1", 0, -1).Result(); !slices.Equal(got, metas) {
		t.Errorf("metas:1 after recover = %v, want %v", got, metas)
	}
	if off, _ := rdb.Get(ctx, "flowlog:{flowlog}:offset:"+testenv.ApplyTopic+":0").Result(); off != "5" {
		t.Errorf("offset after recover = %q, want Kafka's 5", off)
	}
	if owner, _ := rdb.Get(ctx, "flowlog:{flowlog}:owner").Result(); owner != backuptest.Group {
		t.Errorf("owner after recover = %q", owner)
	}
	// A second recover finds the prefix claimed.
	if _, err := capture(t, func() error { return runRecover(ctx, args) }); err == nil {
		t.Error("a second recover over the recovered prefix went through")
	}
}
