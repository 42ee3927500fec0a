package pipeline

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Health probes. /readyz and /status answer within their own deadline
// (probeDeadline) whatever the dependencies do: a Redis under CLIENT
// PAUSE, a GCS that accepts and never answers. Each dependency's check
// runs in a goroutine of its own, at most one at a time per dependency and
// at most once per probeTTL; a request starts the checks that are due,
// waits for them until its deadline, and answers from what is known then:
// a check still running past the deadline makes its dependency "slow",
// named in the answer with how long it has gone unanswered.
const (
	// probeDeadline is how long /readyz waits for the checks it starts.
	probeDeadline = 800 * time.Millisecond
	// probeTTL is how long a check's outcome is reused.
	probeTTL = time.Second
	// probeTimeout bounds one check; a dependency that does not answer
	// within it fails the check with a timeout.
	probeTimeout = 5 * time.Second
)

// Probe is a readiness check of one dependency, named for what it checks
// ("redis", "kafka", "gcs").
type Probe struct {
	Name  string
	Check func(context.Context) error
}

// DependencyStatus is what the consumer knows of one dependency, the
// "dependencies" of /status.
type DependencyStatus struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Slow is set while a check has gone unanswered past the probe
	// deadline; Waiting is how long, in seconds.
	Slow    bool    `json:"slow,omitempty"`
	Waiting float64 `json:"waiting_seconds,omitempty"`
	// Error is the last failed check's error.
	Error string `json:"error,omitempty"`
	// CheckedAt is when the last check finished (zero: none yet).
	CheckedAt time.Time `json:"checked_at,omitzero"`
}

// problem is the dependency's trouble in one line, "" if none.
func (d DependencyStatus) problem() string {
	switch {
	case d.Slow:
		return fmt.Sprintf("%s: no answer for %.1fs", d.Name, d.Waiting)
	case !d.OK && d.Error != "":
		return d.Name + ": " + d.Error
	case !d.OK:
		return d.Name + ": not checked yet"
	}
	return ""
}

// prober runs the checks of a set of probes.
type prober struct {
	probes []*probeState
	now    func() time.Time
}

type probeState struct {
	Probe
	mu      sync.Mutex
	running chan struct{} // closed when the running check ends; nil if none
	started time.Time
	at      time.Time // when the last check ended
	err     error
}

func newProber(probes []Probe) *prober {
	p := &prober{now: time.Now}
	for _, pr := range probes {
		p.probes = append(p.probes, &probeState{Probe: pr})
	}
	return p
}

// kick starts the check if it is due, and returns the channel of the
// running check (nil if none runs) and when it started.
func (s *probeState) kick(now time.Time) (chan struct{}, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running != nil || !s.at.IsZero() && now.Sub(s.at) < probeTTL {
		return s.running, s.started
	}
	done := make(chan struct{})
	s.running, s.started = done, now
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		err := s.Check(ctx)
		cancel()
		s.mu.Lock()
		s.err, s.at, s.running = err, time.Now(), nil
		s.mu.Unlock()
		close(done)
	}()
	return done, now
}

func (s *probeState) status(now time.Time) DependencyStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := DependencyStatus{Name: s.Name, OK: !s.at.IsZero() && s.err == nil, CheckedAt: s.at}
	if s.err != nil {
		d.Error = s.err.Error()
	}
	if s.running != nil {
		if w := now.Sub(s.started); w >= probeDeadline {
			d.Slow, d.OK, d.Waiting = true, false, w.Seconds()
		}
	}
	return d
}

// check starts the checks that are due and waits for the running ones,
// each at most until wait after it started (a check that has run that long
// already is slow, and waiting longer says nothing new), then returns
// every dependency's status.
func (p *prober) check(ctx context.Context, wait time.Duration) []DependencyStatus {
	type run struct {
		done    chan struct{}
		started time.Time
	}
	var runs []run
	for _, s := range p.probes {
		if ch, started := s.kick(p.now()); ch != nil {
			runs = append(runs, run{ch, started})
		}
	}
	for _, r := range runs {
		if wait <= 0 {
			break
		}
		left := r.started.Add(wait).Sub(p.now())
		if left <= 0 {
			continue
		}
		t := time.NewTimer(left)
		select {
		case <-r.done:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	now := p.now()
	out := make([]DependencyStatus, len(p.probes))
	for i, s := range p.probes {
		out[i] = s.status(now)
	}
	return out
}
