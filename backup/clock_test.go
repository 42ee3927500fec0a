package backup_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

// TestRefuseTheFuture: a restore or snapshot never claims a time that has
// not come: a ts further ahead of the clock than the allowed skew is
// refused, and so is every read of a flow whose checkpoint lies there (only
// a ts no clock could give moves it there, so what it claims is unproven).
func TestRefuseTheFuture(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	inAnHour := event.ComposeTS(time.Now().Add(time.Hour).UnixMilli(), 0)
	read := func(ts uint64, skew time.Duration) error {
		_, err := backup.Restore(ctx, e.Source(), backup.RestoreRequest{Request: backup.Request{Flow: flowF, TS: ts, MaxClockSkew: skew},
			OutDir: t.TempDir() + "/out", TempDir: t.TempDir()})
		return err
	}
	var fe *backup.FutureError
	if err := read(inAnHour, backuptest.Skew); !errors.As(err, &fe) || fe.Checkpoint || fe.TS != inAnHour || fe.Skew != backuptest.Skew ||
		fe.Ahead < 50*time.Minute || fe.Ahead > time.Hour {
		t.Errorf("restore an hour ahead = %v (%+v), want a *backup.FutureError of the ts", err, fe)
	}
	var pc *backup.PastCheckpointError
	if err := read(inAnHour, 2*time.Hour); !errors.As(err, &pc) {
		t.Errorf("restore an hour ahead with a 2h skew = %v, want it refused as past the checkpoint", err)
	}
	if err := read(0, backuptest.Skew); err != nil {
		t.Fatalf("restore at the honest checkpoint: %v", err)
	}

	// A checkpoint moved to 2^64-1 by a heartbeat a version that took any
	// ts accepted.
	if err := e.Redis.Client(t).HSet(ctx, meta.NewKeys("flowlog").FlowState(1), "checkpoint_ts", strconv.FormatUint(math.MaxUint64, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	for _, ts := range []uint64{0, e.TS(20 * time.Minute)} {
		if err := read(ts, backuptest.Skew); !errors.As(err, &fe) || !fe.Checkpoint || fe.TS != math.MaxUint64 || fe.Flow.ID != 1 {
			t.Errorf("restore at %d with the checkpoint at 2^64-1 = %v, want a *backup.FutureError of the checkpoint", ts, err)
		}
	}
	if _, _, err := snapshot(t, e, 0); !errors.As(err, &fe) || !fe.Checkpoint {
		t.Errorf("snapshot with the checkpoint at 2^64-1 = %v, want a *backup.FutureError of the checkpoint", err)
	}
}

// TestVerifyClock: verify's clock rule reports every checkpoint and window
// bound further ahead of the clock than the skew, in order, with how far
// ahead it lies, and nothing within the skew; the Redis checkpoint only
// when there is one (a verify from the bucket alone has none).
func TestVerifyClock(t *testing.T) {
	now := time.Now()
	skew := time.Minute
	honest := event.ComposeTS(now.UnixMilli(), 0)
	ahead := event.ComposeTS(now.Add(time.Hour).UnixMilli(), 0)
	windows := []meta.Window{{TableID: 1, Since: honest}, {TableID: 2, Since: ahead, Until: &ahead}, {TableID: 3, Since: honest, Until: &honest}}
	for _, tc := range []struct {
		name      string
		redis     *uint64
		ckpt      uint64
		windows   []meta.Window
		wantKinds []string
		wantTable []uint32
	}{
		{"all honest", &honest, honest, windows[:1], nil, nil},
		{"redis checkpoint ahead", &ahead, honest, nil, []string{backup.BoundRedisCheckpoint}, []uint32{0}},
		{"no redis checkpoint", nil, ahead, nil, []string{backup.BoundCheckpointObject}, []uint32{0}},
		{"windows", &honest, honest, windows, []string{backup.BoundWindowSince, backup.BoundWindowUntil}, []uint32{2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := backup.VerifyClock(tc.redis, tc.ckpt, tc.windows, now, skew)
			if len(got) != len(tc.wantKinds) {
				t.Fatalf("bounds %+v, want kinds %v", got, tc.wantKinds)
			}
			for i, b := range got {
				if b.Kind != tc.wantKinds[i] || b.Table != tc.wantTable[i] || b.TS != ahead || b.Skew != skew ||
					b.Ahead < 59*time.Minute || b.Ahead > time.Hour {
					t.Errorf("bound %d = %+v, want %s of table %d at %d, about 1h ahead", i, b, tc.wantKinds[i], tc.wantTable[i], ahead)
				}
			}
		})
	}
}
