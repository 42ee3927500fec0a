package replay

import (
	"context"
	"time"
)

// Clock is the time a rate limiter reads and waits on.
type Clock interface {
	Now() time.Time
	// Sleep waits d or until ctx ends.
	Sleep(ctx context.Context, d time.Duration) error
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// limiter bounds the bytes per second sent: a token bucket of rate bytes
// per second holding at most half a second's worth (the burst). A record
// waits until the bucket holds its size; one larger than the burst
// forfeits what the bucket holds and waits until it filled up to its size
// from empty: so no record goes out faster than the rate, and over any
// window of w seconds of records up to the burst at most rate*w + burst
// bytes go out, within 5% of the rate over 10 s. (A record is counted when
// it is handed to the producer; one larger than a second's worth of the
// rate exceeds a 10 s window's bound by itself however it is spaced.)
type limiter struct {
	rate   float64 // bytes per second; 0: unbounded
	burst  float64
	clock  Clock
	tokens float64
	last   time.Time
}

func newLimiter(rate int64, c Clock) *limiter {
	l := &limiter{rate: float64(rate), burst: float64(rate) / 2, clock: c}
	l.tokens = l.burst
	l.last = c.Now()
	return l
}

// wait blocks until n bytes may go out, and takes them.
func (l *limiter) wait(ctx context.Context, n int) error {
	if l.rate <= 0 {
		return nil
	}
	need := float64(n)
	big := need > l.burst
	for first := true; ; first = false {
		now := l.clock.Now()
		l.tokens = min(l.tokens+now.Sub(l.last).Seconds()*l.rate, max(l.burst, need))
		l.last = now
		if big && first {
			// A record larger than the burst forfeits it: it goes out no
			// sooner than its size takes at the rate.
			l.tokens = min(l.tokens, 0)
		}
		if l.tokens >= need {
			l.tokens -= need
			return nil
		}
		d := time.Duration((need - l.tokens) / l.rate * float64(time.Second))
		if err := l.clock.Sleep(ctx, max(d, time.Millisecond)); err != nil {
			return err
		}
	}
}
