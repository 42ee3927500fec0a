package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/meta"
)

// TestOperatorCommandsRefuseTheFuture: restore and snapshot word a ts or a
// checkpoint past the clock plus --max-clock-skew as refused, naming the
// flag, and verify reports the checkpoint and any window bound there as
// faults.
func TestOperatorCommandsRefuseTheFuture(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	restore := func(extra ...string) (string, error) {
		return runIn(t, e.Conn, "restore", append([]string{"--flow", "f", "--out", filepath.Join(t.TempDir(), "out"), "--temp-dir", t.TempDir()}, extra...)...)
	}
	const refused = "ahead of this machine's clock, more than --max-clock-skew 5m0s: refused"

	inAnHour := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if _, err := restore("--ts", inAnHour); err == nil || !strings.HasPrefix(err.Error(), "--ts "+inAnHour+" is TSO ") || !strings.Contains(err.Error(), refused) {
		t.Errorf("restore --ts %s = %v, want it refused as the future", inAnHour, err)
	}
	if out, err := restore("--ts", inAnHour, "--max-clock-skew", "2h"); err == nil || !strings.Contains(err.Error(), "is past the flow's checkpoint") {
		t.Errorf("restore --ts %s with a 2h skew = %v, want it refused as past the checkpoint\n%s", inAnHour, err, out)
	}

	// A checkpoint moved to 2^64-1 by a heartbeat a version that took any
	// ts accepted.
	rdb := e.Redis.Client(t)
	k := meta.NewKeys("flowlog")
	if err := rdb.HSet(ctx, k.FlowState(1), "checkpoint_ts", strconv.FormatUint(math.MaxUint64, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := restore("--ts", fmt.Sprint(e.TS(20*time.Minute))); err == nil ||
		!strings.Contains(err.Error(), "the checkpoint of flow default/f (id 1) is 18446744073709551615") || !strings.Contains(err.Error(), refused) {
		t.Errorf("restore with the checkpoint at 2^64-1 = %v, want it refused", err)
	}
	if _, err := runIn(t, e.Conn, "snapshot", "--flow", "f", "--temp-dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), refused) {
		t.Errorf("snapshot with the checkpoint at 2^64-1 = %v, want it refused", err)
	}

	// A window whose since lies in the future (a maxts of 2^63).
	w, _ := json.Marshal(meta.Window{Since: uint64(1) << 63})
	if err := rdb.HSet(ctx, k.Coverage(1), "3", string(w)).Err(); err != nil {
		t.Fatal(err)
	}
	out, err := runIn(t, e.Conn, "verify", "--flow", "f", "--json")
	if err == nil {
		t.Fatalf("verify with a checkpoint and a window in the future passed:\n%s", out)
	}
	var rep struct {
		OK     bool     `json:"ok"`
		Faults []string `json:"faults"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("verify --json output: %v\n%s", err, out)
	}
	joined := strings.Join(rep.Faults, "\n")
	for _, want := range []string{
		"redis checkpoint 18446744073709551615 (4199-11-24",
		"table 3: coverage window since 9223372036854775808",
	} {
		if rep.OK || !strings.Contains(joined, want) {
			t.Errorf("verify faults lack %q (ok=%v):\n%s", want, rep.OK, joined)
		}
	}
}
