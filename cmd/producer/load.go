package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/internal/loadgen"
)

// format is the --format flag: how ApplyBatch records are encoded.
type format string

const (
	formatProto format = "proto"
	formatJSON  format = "json"
)

func (f *format) String() string { return string(*f) }

func (f *format) Set(s string) error {
	switch format(s) {
	case formatProto, formatJSON:
		*f = format(s)
		return nil
	}
	return fmt.Errorf("unknown format %q: want proto or json", s)
}

// applyRecord encodes b as a record of the apply topic keyed by its region.
func applyRecord(topic string, b *event.Batch, f format) (*kgo.Record, error) {
	r := &kgo.Record{Topic: topic, Key: strconv.AppendUint(nil, b.RegionID, 10)}
	if f == formatJSON {
		v, err := event.EncodeBatchJSON(b)
		if err != nil {
			return nil, fmt.Errorf("encode region %d batch as JSON: %w", b.RegionID, err)
		}
		r.Value = v
		r.Headers = []kgo.RecordHeader{{Key: event.HeaderContentType, Value: []byte("application/json")}}
		return r, nil
	}
	r.Value = event.EncodeBatch(nil, b)
	return r, nil
}

// addTimeoutFlag registers --timeout on fs.
func addTimeoutFlag(fs *flag.FlagSet, d *time.Duration) {
	fs.DurationVar(d, "timeout", 30*time.Second,
		"give up when Kafka has not acknowledged a publish for this long, naming the broker and the cause (0: wait forever)")
}

// runLoad publishes the deterministic load of loadgen to the apply topic.
func runLoad(ctx context.Context, args []string) error {
	fs := newFlagSet("load")
	var lc loadgen.Config
	lc.RegisterFlags(fs)
	var kc kafkaconf.Config
	kc.RegisterFlagsFor(fs, kafkaconf.ApplyTopic)
	rate := fs.Float64("rate", 0, "events per second (0: as fast as the broker takes them)")
	var timeout time.Duration
	addTimeoutFlag(fs, &timeout)
	f := formatProto
	fs.Var(&f, "format", "record encoding: proto, or json (protojson with header content-type: application/json)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if err := errors.Join(lc.Validate(), kc.Validate()); err != nil {
		return &cli.UsageError{Err: err}
	}
	if *rate < 0 {
		return cli.Usagef("--rate %v: must not be negative", *rate)
	}
	if timeout < 0 {
		return cli.Usagef("--timeout %v: must not be negative", timeout)
	}
	if lc.StartTime.IsZero() {
		lc.StartTime = time.Now().UTC().Add(-lc.Span())
	}
	cl, err := newProducer(&kc, timeout, os.Stderr)
	if err != nil {
		return err
	}
	defer cl.Close()

	l := &loader{cl: cl, topic: kc.ApplyTopic, format: f, rate: *rate, gen: loadgen.New(lc)}
	stop := func() {}
	if isTerminal(os.Stderr) {
		stop = l.progress(os.Stderr, lc.Events)
	}
	err = l.run(ctx)
	stop()
	if err != nil {
		return err
	}
	l.summary(os.Stdout)
	return nil
}

// loader publishes one load and counts what it published.
type loader struct {
	cl     *producer
	topic  string
	format format
	rate   float64
	gen    *loadgen.Generator

	start   time.Time
	elapsed time.Duration
	records atomic.Int64
	bytes   atomic.Int64
	events  atomic.Int64
	txns    atomic.Int64

	errOnce sync.Once
	err     error
	failed  atomic.Bool

	produced     atomic.Int64 // records handed to the client
	pending      atomic.Int64 // records produced and not yet acknowledged or failed
	lastProgress atomic.Int64 // unix nanos of the last ack, or of a moment with nothing pending
}

func (l *loader) fail(err error) {
	l.errOnce.Do(func() { l.err = err; l.failed.Store(true) })
}

// run produces every batch asynchronously, pacing to the rate, and waits
// for every record to be acknowledged. It gives up when records stay
// unacknowledged for the producer's timeout.
func (l *loader) run(parent context.Context) error {
	l.start = time.Now()
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	if l.cl.timeout > 0 {
		go l.watchdog(ctx, cancel)
	}
	err := l.produceAll(ctx)
	if err == nil {
		if ferr := l.cl.Flush(ctx); ferr != nil {
			err = fmt.Errorf("wait for acks: %w", ferr)
		}
	}
	l.elapsed = time.Since(l.start)
	if err == nil && l.failed.Load() {
		err = l.err
	}
	switch {
	case err == nil:
		return nil
	case parent.Err() != nil:
		return fmt.Errorf("interrupted with %d of %d records acknowledged; %s", l.records.Load(), l.produced.Load(), l.cl.watch.describe())
	case errors.Is(context.Cause(ctx), errNoAck):
		return fmt.Errorf("publish to %s: no acknowledgement from Kafka for %v (--timeout), %d of %d records acknowledged; %s",
			l.topic, l.cl.timeout, l.records.Load(), l.produced.Load(), l.cl.watch.describe())
	}
	return err
}

// produceAll hands every batch of the load to the client.
func (l *loader) produceAll(ctx context.Context) error {
	for !l.failed.Load() {
		b, ok := l.gen.Next()
		if !ok {
			return nil
		}
		rec, err := applyRecord(l.topic, b, l.format)
		if err != nil {
			return err
		}
		size := int64(len(rec.Key) + len(rec.Value))
		l.pending.Add(1)
		l.produced.Add(1)
		l.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			defer l.pending.Add(-1)
			if err != nil {
				l.fail(fmt.Errorf("produce to %s: %w; %s", l.topic, err, l.cl.watch.describe()))
				return
			}
			l.lastProgress.Store(time.Now().UnixNano())
			l.records.Add(1)
			l.bytes.Add(size)
		})
		l.events.Store(int64(l.gen.Events()))
		l.txns.Store(int64(l.gen.Transactions()))
		if err := l.holdFuture(ctx); err != nil {
			return err
		}
		if l.rate > 0 {
			due := l.start.Add(time.Duration(float64(l.gen.Events()) / l.rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
	}
	return nil
}

// maxAhead is how far ahead of the clock the load's ts may run: a fifth of
// the consumer's default --max-clock-skew, which refuses records further
// ahead.
const maxAhead = time.Minute

// holdFuture waits while the ts published so far run more than maxAhead
// ahead of the clock: a load with few regions, or one started at a later
// --start-time, moves its TSO clocks faster than time passes.
func (l *loader) holdFuture(ctx context.Context) error {
	ahead := event.Ahead(l.gen.MaxTS(), time.Now())
	if ahead <= maxAhead {
		return nil
	}
	select {
	case <-time.After(ahead - maxAhead):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchdog cancels ctx with errNoAck once records have waited for an
// acknowledgement for the producer's timeout with none arriving.
func (l *loader) watchdog(ctx context.Context, cancel context.CancelCauseFunc) {
	l.lastProgress.Store(time.Now().UnixNano())
	t := time.NewTicker(min(max(l.cl.timeout/20, 10*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if l.pending.Load() == 0 {
				l.lastProgress.Store(now.UnixNano())
				continue
			}
			if now.Sub(time.Unix(0, l.lastProgress.Load())) >= l.cl.timeout {
				cancel(errNoAck)
				return
			}
		}
	}
}

// summary prints the final line.
func (l *loader) summary(w io.Writer) {
	secs := max(l.elapsed.Seconds(), 1e-9)
	mb := float64(l.bytes.Load()) / 1e6
	fmt.Fprintf(w, "produced %d events in %d records (%.2f MB) in %v: %.0f events/s, %.2f MB/s; max resolved ts %d\n",
		l.events.Load(), l.records.Load(), mb, l.elapsed.Round(time.Millisecond),
		float64(l.events.Load())/secs, mb/secs, l.gen.MaxResolvedTS())
}

// progress draws a progress bar of transactions on w until stop is called.
func (l *loader) progress(w io.Writer, total int) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				l.drawBar(w, total)
				fmt.Fprintln(w)
				return
			case <-t.C:
				l.drawBar(w, total)
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (l *loader) drawBar(w io.Writer, total int) {
	const width = 30
	n := int(l.txns.Load())
	frac := 1.0
	if total > 0 {
		frac = min(float64(n)/float64(total), 1)
	}
	fill := int(frac * width)
	secs := max(time.Since(l.start).Seconds(), 1e-9)
	fmt.Fprintf(w, "\r[%s%s] %3.0f%% %d/%d txns, %d records acked, %.1f MB, %.0f events/s ",
		strings.Repeat("=", fill), strings.Repeat(" ", width-fill), frac*100, n, total,
		l.records.Load(), float64(l.bytes.Load())/1e6, float64(l.events.Load())/secs)
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// runHeartbeat publishes one empty batch per region, advancing every
// region's resolved ts to --ts, or to the TSO of --start-time (default now).
func runHeartbeat(ctx context.Context, args []string) error {
	fs := newFlagSet("heartbeat")
	var kc kafkaconf.Config
	kc.RegisterFlagsFor(fs, kafkaconf.ApplyTopic)
	regions := fs.Int("regions", 4, "regions to send a heartbeat for (ids 1..N)")
	ts := fs.Uint64("ts", 0, "resolved ts to advance to (0: from --start-time)")
	var at time.Time
	fs.Func("start-time", "time to advance the resolved ts to, RFC 3339 (default: now)", func(s string) error {
		t, err := time.Parse(time.RFC3339Nano, s)
		at = t
		return err
	})
	f := formatProto
	fs.Var(&f, "format", "record encoding: proto or json")
	var timeout time.Duration
	addTimeoutFlag(fs, &timeout)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if err := kc.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	if *regions < 1 {
		return cli.Usagef("--regions %d: must be at least 1", *regions)
	}
	if *ts == 0 {
		if at.IsZero() {
			at = time.Now()
		}
		*ts = event.ComposeTS(at.UnixMilli(), 0)
	}
	cl, err := newProducer(&kc, timeout, os.Stderr)
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, *regions)
	for r := 1; r <= *regions; r++ {
		rec, err := applyRecord(kc.ApplyTopic, &event.Batch{RegionID: uint64(r), ResolvedTS: *ts}, f)
		if err != nil {
			return err
		}
		recs = append(recs, rec)
	}
	if _, err := cl.publishSync(ctx, recs...); err != nil {
		return fmt.Errorf("produce heartbeats to %s: %w", kc.ApplyTopic, err)
	}
	fmt.Printf("sent %d heartbeats at resolved ts %d\n", *regions, *ts)
	return nil
}
