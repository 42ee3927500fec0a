package pipeline

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestProberSlowDependency: a check that never answers makes its
// dependency slow after probeDeadline, without holding up the answer
// beyond it or the other dependencies' outcomes; a later request finds it
// still running and answers at once; a failing check reports its error;
// outcomes are reused for probeTTL.
func TestProberSlowDependency(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var fastCalls atomic.Int64
	p := newProber([]Probe{
		{Name: "stuck", Check: func(ctx context.Context) error {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return ctx.Err()
		}},
		{Name: "fast", Check: func(context.Context) error { fastCalls.Add(1); return nil }},
		{Name: "broken", Check: func(context.Context) error { return errors.New("refused") }},
	})
	start := time.Now()
	deps := p.check(context.Background(), probeDeadline)
	took := time.Since(start)
	if took < probeDeadline || took > probeDeadline+time.Second {
		t.Errorf("first check took %v, want about %v", took, probeDeadline)
	}
	want := map[string]string{"stuck": "stuck: no answer for", "fast": "", "broken": "broken: refused"}
	for _, d := range deps {
		if got := d.problem(); !strings.HasPrefix(got, want[d.Name]) || (want[d.Name] == "") != (got == "") {
			t.Errorf("%s: problem %q, want %q", d.Name, got, want[d.Name])
		}
	}
	start = time.Now()
	deps = p.check(context.Background(), probeDeadline)
	if took := time.Since(start); took > 200*time.Millisecond {
		t.Errorf("second check took %v: it waited for a check known to be slow", took)
	}
	if !deps[0].Slow || deps[0].Waiting < probeDeadline.Seconds() {
		t.Errorf("stuck dependency %+v, want slow since the first check", deps[0])
	}
	if n := fastCalls.Load(); n != 1 {
		t.Errorf("fast check ran %d times within %v, want once (outcomes are reused)", n, probeTTL)
	}
}
