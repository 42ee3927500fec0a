package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/meta"
)

// waitPoll is how often --wait reads ddl:offset.
const waitPoll = 200 * time.Millisecond

// ErrRejected is the error of a DDL record the consumer sent to the DLQ.
var ErrRejected = errors.New("rejected by the consumer")

// ddlWaiter tells, for a DDL record it saw published, whether a consumer
// applied it or rejected it: a consumer's DDL applier advances
// ddl:offset:<topic>:<partition> in Redis past every record it handled.
// A rejected record is claimed in the same transaction that advances the
// offset, then written to the DLQ with headers naming the record's
// partition and offset, and only then is the claim deleted.
type ddlWaiter struct {
	kc       kafkaconf.Config
	store    *meta.Store
	rdb      redis.UniversalClient
	redisURL string
	adm      *kadm.Client
	dlqStart map[int32]int64 // DLQ end offsets before the record was published
	timeout  time.Duration
}

// newDDLWaiter connects to Redis (checking it answers) and notes where the
// DLQ ends, before the record is published.
func newDDLWaiter(ctx context.Context, kc kafkaconf.Config, rc meta.Config, cl *kgo.Client, timeout time.Duration) (*ddlWaiter, error) {
	redis.SetLogger(quietRedis{})
	rdb, err := rc.NewClient()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	w := &ddlWaiter{kc: kc, rdb: rdb, store: meta.NewStore(rdb, rc.Prefix, nil), redisURL: cli.RedactURL(rc.URL),
		adm: kadm.NewClient(cl), timeout: timeout}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("--wait: redis at %s: %w", w.redisURL, err)
	}
	if w.dlqStart, err = w.dlqEnds(pctx); err != nil {
		rdb.Close()
		return nil, err
	}
	return w, nil
}

// Close closes the Redis client.
func (w *ddlWaiter) Close() { w.rdb.Close() }

// dlqEnds lists the DLQ topic's end offsets; a DLQ topic that does not
// exist yet has none.
func (w *ddlWaiter) dlqEnds(ctx context.Context) (map[int32]int64, error) {
	ends, err := w.adm.ListEndOffsets(ctx, w.kc.DLQTopic)
	if err != nil {
		return nil, fmt.Errorf("--wait: list end offsets of %s: %w", w.kc.DLQTopic, err)
	}
	out := map[int32]int64{}
	var ferr error
	ends.Each(func(o kadm.ListedOffset) {
		switch {
		case o.Err == nil:
			out[o.Partition] = o.Offset
		case !errors.Is(o.Err, kerr.UnknownTopicOrPartition):
			ferr = fmt.Errorf("--wait: end offset of %s/%d: %w", o.Topic, o.Partition, o.Err)
		}
	})
	return out, ferr
}

// wait waits until a consumer handled rec (published to the DDL topic) and
// returns nil if it applied it, an error wrapping ErrRejected with the
// DLQ's reason if it rejected it, or an error if neither happened within
// the timeout. Progress notes go to stderr.
func (w *ddlWaiter) wait(ctx context.Context, rec *kgo.Record, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	key := w.store.Keys().DDLOffset(rec.Topic, rec.Partition)
	announce := time.Now().Add(announceAfter)
	var seen int64 = -1
	for {
		off, ok, err := w.store.DDLOffset(ctx, rec.Topic, rec.Partition)
		switch {
		case err == nil && ok && off > rec.Offset:
			// A rejection advances ddl:offset together with a claim on the
			// DLQ record, and the record is sent after: while the claim is
			// pending the DLQ does not yet tell the verdict.
			owed, perr := w.rejectOwed(ctx, rec)
			if perr != nil && ctx.Err() == nil {
				return perr
			}
			if perr == nil && !owed {
				return w.verdict(ctx, rec)
			}
			seen = off
		case err == nil && ok:
			seen = off
		case err != nil && ctx.Err() == nil:
			return fmt.Errorf("--wait: read %s from redis at %s: %w", key, w.redisURL, err)
		}
		if !announce.IsZero() && time.Now().After(announce) {
			fmt.Fprintf(stderr, "waiting for a consumer to apply offset %d (%s is %s in redis at %s); giving up after %v (--wait-timeout)\n",
				rec.Offset, key, offsetText(seen), w.redisURL, w.timeout)
			announce = time.Time{}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("--wait: no consumer handled offset %d within %v (--wait-timeout): %s is %s in redis at %s; is a consumer running with this --redis-url and --redis-prefix?",
					rec.Offset, w.timeout, key, offsetText(seen), w.redisURL)
			}
			return fmt.Errorf("--wait: interrupted before a consumer handled offset %d: %w", rec.Offset, ctx.Err())
		case <-time.After(waitPoll):
		}
	}
}

// offsetText is an offset read from ddl:offset, or "unset".
func offsetText(off int64) string {
	if off < 0 {
		return "unset"
	}
	return strconv.FormatInt(off, 10)
}

// rejectOwed reports whether a consumer has claimed rec for the DLQ and
// not yet sent its DLQ record.
func (w *ddlWaiter) rejectOwed(ctx context.Context, rec *kgo.Record) (bool, error) {
	claims, err := w.store.PendingDDLRejects(ctx, rec.Topic, rec.Partition)
	if err != nil {
		return false, fmt.Errorf("--wait: read pending rejections in redis at %s: %w", w.redisURL, err)
	}
	for _, c := range claims {
		if c.Offset == rec.Offset {
			return true, nil
		}
	}
	return false, nil
}

// verdict looks for rec in the DLQ records written since the waiter was
// created. It is called once ddl:offset passed rec and no rejection of rec
// is pending: a rejected record is in the DLQ by then, so if it is not
// there, rec was applied.
func (w *ddlWaiter) verdict(ctx context.Context, rec *kgo.Record) error {
	ends, err := w.dlqEnds(ctx)
	if err != nil {
		return err
	}
	parts := map[int32]kgo.Offset{}
	for p, end := range ends {
		if start := w.dlqStart[p]; end > start {
			parts[p] = kgo.NewOffset().At(start)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	opts, err := w.kc.Opts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{w.kc.DLQTopic: parts}))...)
	if err != nil {
		return fmt.Errorf("--wait: kafka client: %w", err)
	}
	defer cl.Close()
	wantPart, wantOff := strconv.Itoa(int(rec.Partition)), strconv.FormatInt(rec.Offset, 10)
	for len(parts) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("--wait: read %s: %w", w.kc.DLQTopic, err)
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return fmt.Errorf("--wait: read %s/%d: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		for _, r := range fs.Records() {
			h := headers(r)
			if h[event.HeaderSourceTopic] == rec.Topic && h[event.HeaderSourcePartition] == wantPart && h[event.HeaderSourceOffset] == wantOff {
				return fmt.Errorf("%w: %s (%s partition %d offset %d)", ErrRejected, h[event.HeaderError], r.Topic, r.Partition, r.Offset)
			}
			if r.Offset+1 >= ends[r.Partition] {
				delete(parts, r.Partition)
			}
		}
	}
	return nil
}

// flowIDText is " (flow id N)" of the flow now named catalog/name, or ""
// if there is none (after a drop) or it cannot be read.
func (w *ddlWaiter) flowIDText(ctx context.Context, catalog, name string) string {
	id, ok, err := w.store.FlowIDByName(ctx, catalog, name)
	if err != nil || !ok {
		return ""
	}
	return fmt.Sprintf(" (flow id %d)", id)
}

// headers returns r's headers by key.
func headers(r *kgo.Record) map[string]string {
	h := make(map[string]string, len(r.Headers))
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	return h
}

// quietRedis drops go-redis's own log lines: the producer reports the
// failures that matter as errors.
type quietRedis struct{}

// Printf implements go-redis's internal.Logging.
func (quietRedis) Printf(context.Context, string, ...any) {}
