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

	"github.com/flowlog/flowlog/meta"
)

// A restore or snapshot never claims a time that has not come: a --ts
// further ahead of the clock than --max-clock-skew is refused, and so is
// every restore of a flow whose checkpoint lies there (only a ts no clock
// could give moves it there, so what it claims is unproven), while verify
// reports the checkpoint and any window bound in the future as faults.
func TestOperatorCommandsRefuseTheFuture(t *testing.T) {
	e := newTimedEnv(t)
	ctx := context.Background()
	restore := func(extra ...string) (string, error) {
		args := e.args(append([]string{"--flow", "f", "--out", filepath.Join(t.TempDir(), "out"), "--temp-dir", t.TempDir()}, extra...)...)
		return capture(t, func() error { return runRestore(ctx, args) })
	}
	const refused = "ahead of this machine's clock, more than --max-clock-skew 5m0s: refused"

	inAnHour := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if _, err := restore("--ts", inAnHour); err == nil || !strings.Contains(err.Error(), refused) {
		t.Errorf("restore --ts %s = %v, want it refused as the future", inAnHour, err)
	}
	if out, err := restore("--ts", inAnHour, "--max-clock-skew", "2h"); err == nil || !strings.Contains(err.Error(), "is past the flow's checkpoint") {
		t.Errorf("restore --ts %s with a 2h skew = %v, want it refused as past the checkpoint\n%s", inAnHour, err, out)
	}
	if out, err := restore(); err != nil {
		t.Fatalf("restore at the honest checkpoint: %v\n%s", err, out)
	}

	// A checkpoint moved to 2^64-1 by a heartbeat a version that took any
	// ts accepted.
	rdb := e.redis.Client(t)
	k := meta.NewKeys("flowlog")
	if err := rdb.HSet(ctx, k.FlowState(1), "checkpoint_ts", strconv.FormatUint(math.MaxUint64, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{nil, {"--ts", fmt.Sprint(e.ts(20 * time.Minute))}} {
		if _, err := restore(args...); err == nil || !strings.Contains(err.Error(), "the checkpoint of flow default/f (id 1) is 18446744073709551615") ||
			!strings.Contains(err.Error(), refused) {
			t.Errorf("restore %v with the checkpoint at 2^64-1 = %v, want it refused", args, err)
		}
	}
	snapArgs := e.args("--flow", "f", "--temp-dir", t.TempDir())
	if _, err := capture(t, func() error { return runSnapshot(ctx, snapArgs) }); err == nil || !strings.Contains(err.Error(), refused) {
		t.Errorf("snapshot with the checkpoint at 2^64-1 = %v, want it refused", err)
	}

	// A window whose since lies in the future (a maxts of 2^63).
	future := uint64(1) << 63
	w, _ := json.Marshal(meta.Window{Since: future})
	if err := rdb.HSet(ctx, k.Coverage(1), "3", string(w)).Err(); err != nil {
		t.Fatal(err)
	}
	verifyArgs := e.args("--flow", "f", "--json")
	out, err := capture(t, func() error { return runVerify(ctx, verifyArgs) })
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
