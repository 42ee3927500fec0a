package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// TestFromBucket: with Redis gone (its URL refused), `restore
// --from-bucket` and `verify --from-bucket` read the flow's catalog, the
// group's checkpoint object and the metas in the bucket, and restore what
// the Redis-backed restore restored, at the checkpoint and before it; the
// Redis-backed commands fail.
func TestFromBucket(t *testing.T) {
	e := backuptest.NewTimed(t) // v1 cycles up to 50m
	e.CommitV2(t, e.TS(56*time.Minute), sinktest.WritePut(2, 9, e.TS(51*time.Minute), e.TS(52*time.Minute), []byte("v2 nine"), true),
		sinktest.WritePut(1, 3, e.TS(53*time.Minute), e.TS(54*time.Minute), []byte("three"), true))
	e.WriteCatalog(t, 1, 1)
	tss := []uint64{0, e.TS(50 * time.Minute), e.TS(53 * time.Minute), e.TS(7 * time.Minute)}
	want := map[uint64]string{}
	for _, ts := range tss {
		want[ts] = restoreTo(t, e.Conn, ts)
	}
	dead := []string{"--redis-url", "redis://" + testenv.ClosedAddr(t)}
	noRedis := append(append([]string{}, e.Conn...), dead...)
	if _, err := runIn(t, noRedis, "restore", "--flow", "f", "--out", t.TempDir()); err == nil {
		t.Fatal("a Redis-backed restore with Redis gone succeeded")
	}
	for _, ts := range tss {
		if got := restoreTo(t, noRedis, ts, "--from-bucket"); got != want[ts] {
			t.Errorf("--from-bucket as of %d:\n%s\nwant\n%s", ts, got, want[ts])
		}
	}
	out, err := runIn(t, noRedis, "verify", "--flow", "f", "--from-bucket")
	if err != nil || !strings.Contains(out, "read from the bucket alone") || !strings.Contains(out, "  OK") {
		t.Errorf("verify --from-bucket: %v\n%s", err, out)
	}
	if out, err = runIn(t, noRedis, "verify", "--all", "--from-bucket"); err != nil || strings.Count(out, "  OK") != 1 {
		t.Errorf("verify --all --from-bucket: %v\n%s", err, out)
	}
}

// restoreTo restores flow f with conn as of ts (0: the checkpoint) and
// returns what a restore from the bucket alone must give as the Redis-backed
// one did: the tables written, the tables left out and why, and the ts
// restored as of.
func restoreTo(t *testing.T, conn []string, ts uint64, extra ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "out")
	args := append([]string{"--flow", "f", "--out", dir}, extra...)
	if ts != 0 {
		args = append(args, "--ts", fmt.Sprint(ts))
	}
	stderr, stdout, err := captureStderr(t, func() error {
		return commands["restore"].run(context.Background(), append(append([]string{}, conn...), args...))
	})
	if err != nil {
		t.Fatalf("restore %v: %v\n%s", extra, err, stderr)
	}
	var said []string
	for _, line := range strings.Split(stderr+stdout, "\n") {
		if strings.HasPrefix(line, "left out ") {
			said = append(said, line)
		}
		if at, _, ok := strings.Cut(line, " into "); ok && strings.HasPrefix(line, "restored flow ") {
			said = append(said, at)
		}
	}
	return fmt.Sprint(backuptest.ReadDir(t, dir)) + "\n" + strings.Join(said, "\n")
}
