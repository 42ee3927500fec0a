package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/internal/kafkaconf"
)

// announceAfter is how long the first contact with a broker may take
// before the producer says on stderr what it is waiting for.
const announceAfter = 2 * time.Second

// errNoAck is the cause of a publish given up after --timeout.
var errNoAck = errors.New("no acknowledgement")

// producer is a Kafka client that publishes idempotently with acks from
// all in-sync replicas and knows how its connections went, so that a
// publish that does not complete names the broker and the cause instead
// of hanging or printing a bare "context canceled".
type producer struct {
	*kgo.Client
	watch   *brokerWatch
	timeout time.Duration
}

// newProducer returns a client that produces idempotently with acks from
// all in-sync replicas (franz-go's defaults, spelled out) and a short linger.
// Records keyed by region id go through the default partitioner, which
// hashes keys as the Java client does, so a region stays in one partition.
// If the first contact with a broker takes longer than announceAfter, a
// "waiting for broker" line goes to stderr.
func newProducer(kc *kafkaconf.Config, timeout time.Duration, stderr io.Writer) (*producer, error) {
	opts, err := kc.Opts()
	if err != nil {
		return nil, err
	}
	w := &brokerWatch{seeds: kc.SeedBrokers(), contacted: make(chan struct{}), done: make(chan struct{})}
	opts = append(opts,
		kgo.DefaultProduceTopic(kc.ApplyTopic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.WithHooks(w),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	go w.announce(stderr, timeout)
	return &producer{Client: cl, watch: w, timeout: timeout}, nil
}

// Close closes the client and stops the announcement.
func (p *producer) Close() {
	p.watch.stop()
	p.Client.Close()
}

// publishSync produces recs and waits for their acks, giving up after the
// producer's timeout (0: never).
func (p *producer) publishSync(ctx context.Context, recs ...*kgo.Record) ([]*kgo.Record, error) {
	pctx, cancel := p.deadline(ctx)
	defer cancel()
	res := p.ProduceSync(pctx, recs...)
	if err := res.FirstErr(); err != nil {
		return nil, p.explain(ctx, pctx, err)
	}
	out := make([]*kgo.Record, len(res))
	for i, r := range res {
		out[i] = r.Record
	}
	return out, nil
}

// deadline returns ctx bounded by the timeout, whose cause is errNoAck.
func (p *producer) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if p.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, p.timeout, errNoAck)
}

// explain turns err, the failure of a publish under pctx (a child of the
// command's ctx), into an error that says what the producer was waiting
// for: the broker that could not be reached and why, an interruption, or
// the timeout.
func (p *producer) explain(ctx, pctx context.Context, err error) error {
	state := p.watch.describe()
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted before Kafka acknowledged the publish; %s", state)
	case errors.Is(context.Cause(pctx), errNoAck):
		return fmt.Errorf("no acknowledgement from Kafka within %v (--timeout); %s", p.timeout, state)
	}
	return fmt.Errorf("%w; %s", err, state)
}

// brokerWatch follows the client's connection attempts (a kgo hook).
type brokerWatch struct {
	seeds     []string
	contacted chan struct{} // closed at the first successful connection
	done      chan struct{} // closed by stop
	once      sync.Once     // closes done

	mu        sync.Mutex
	connected []string // brokers connected to, in order
	lastAddr  string   // broker of the last failed connection
	lastErr   error
}

var _ kgo.HookBrokerConnect = (*brokerWatch)(nil)

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (w *brokerWatch) OnBrokerConnect(m kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	addr := net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port)))
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.lastAddr, w.lastErr = addr, err
		return
	}
	for _, a := range w.connected {
		if a == addr {
			return
		}
	}
	w.connected = append(w.connected, addr)
	if len(w.connected) == 1 {
		close(w.contacted)
	}
}

// describe says which broker the client is connected to or, if none, which
// one it could not reach and why.
func (w *brokerWatch) describe() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.lastErr != nil && len(w.connected) == 0:
		return fmt.Sprintf("broker %s: %v", w.lastAddr, w.lastErr)
	case w.lastErr != nil:
		return fmt.Sprintf("connected to broker %s; last failure: broker %s: %v", strings.Join(w.connected, ","), w.lastAddr, w.lastErr)
	case len(w.connected) > 0:
		return fmt.Sprintf("connected to broker %s", strings.Join(w.connected, ","))
	}
	return fmt.Sprintf("no answer yet from broker %s", strings.Join(w.seeds, ","))
}

// announce writes one "waiting for broker" line to stderr if no broker
// answered within announceAfter.
func (w *brokerWatch) announce(stderr io.Writer, timeout time.Duration) {
	t := time.NewTimer(announceAfter)
	defer t.Stop()
	select {
	case <-w.contacted:
	case <-w.done:
	case <-t.C:
		limit := "until interrupted"
		if timeout > 0 {
			limit = fmt.Sprintf("giving up after %v (--timeout)", timeout)
		}
		w.mu.Lock()
		why := ""
		if w.lastErr != nil {
			why = fmt.Sprintf(" (%v)", w.lastErr)
		}
		w.mu.Unlock()
		fmt.Fprintf(stderr, "waiting for broker %s%s; %s\n", strings.Join(w.seeds, ","), why, limit)
	}
}

// stop ends a pending announcement.
func (w *brokerWatch) stop() { w.once.Do(func() { close(w.done) }) }
