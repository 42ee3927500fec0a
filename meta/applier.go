package meta

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/internal/dlq"
)

// DLQ reasons of the applier: a record that is not a valid FlowDDL, and a
// valid one whose change the metadata refuses.
const (
	ReasonDDLInvalid  = "ddl_invalid"
	ReasonDDLRejected = "ddl_rejected"
)

// ApplierConfig configures an Applier.
type ApplierConfig struct {
	Topic      string      // the DDL topic
	KafkaOpts  []kgo.Opt   // connection options (seeds, TLS, SASL); no group
	DLQ        *dlq.Writer // where invalid and rejected DDL goes
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// StallTimeout bounds how long CatchUp waits for a record below the end
	// offsets it listed before giving up with an error; default 10s.
	StallTimeout time.Duration
	// MaxTablesPerFlow refuses, to the DLQ as ddl_rejected, a create or
	// replace of more source tables (ErrTooManyTables); default
	// DefaultMaxTablesPerFlow.
	MaxTablesPerFlow int
	// ClaimTimeout is how old another instance's claim on sending a
	// rejected DDL to the DLQ must be before this one takes it over and
	// sends it itself (the owner crashed in between); default 30s. An
	// instance's own send is bounded by half of it.
	ClaimTimeout time.Duration
}

// Applier applies the DDL topic to Redis, exactly once per record.
//
// Why each record is applied once and none is skipped: every instance reads
// every partition of the DDL topic (no consumer group) from the offset
// stored in ddl:offset:<topic>:<p>. A valid record is applied by
// Store.ApplyDDL, which writes ddl:offset in the same MULTI as the change and
// does nothing if the stored offset is already past the record, so a record
// seen again — by a restarted instance, or by a second instance racing this
// one — is Skipped, never applied twice. A record that is invalid or refused
// is claimed for the DLQ in the MULTI that advances its offset, and the
// claim stays in Redis until the DLQ acknowledged the record, so a crash in
// between leaves the record owed, not lost (ddl_reject.go; docs/FORMAT.md,
// "DDL barrier"). Any Redis or Kafka error stops the catch-up at that
// record, and the next catch-up seeks back to the first record not yet
// handled.
type Applier struct {
	s       *Store
	r       *Registry
	cfg     ApplierConfig
	log     *slog.Logger
	cl      *kgo.Client
	adm     *kadm.Client
	applied *prometheus.CounterVec

	mu      sync.Mutex      // one catch-up at a time; guards the fields below
	done    map[int32]int64 // next offset known handled, per partition consumed
	reseek  bool            // the client's positions may be past done
	started bool            // a first catch-up ran
	// stale is set while Redis may hold changes the registry has not
	// loaded (a refresh failed): no catch-up succeeds until one has.
	stale bool
	// pending are outcomes handled but not yet returned, because the
	// catch-up that handled them failed later on.
	pending []Applied

	id        string    // this instance, the owner of its DLQ claims
	sweepNow  bool      // a DLQ claim may be owed: sweep on the next catch-up
	lastSweep time.Time // when claims were last swept
	// acked are claims of this instance whose DLQ record was acknowledged
	// but whose deletion from Redis failed: a retry only deletes them.
	acked map[claimKey]bool
}

// DefaultMaxTablesPerFlow is --max-tables-per-flow's default.
const DefaultMaxTablesPerFlow = 100_000

var ddlOps = []string{OpCreate, OpReplace, OpDrop, OpResume, "unknown"}

// NewApplier returns an Applier of cfg.Topic over s that keeps r current. It
// owns a Kafka client, closed by Close.
func NewApplier(s *Store, r *Registry, cfg ApplierConfig) (*Applier, error) {
	if cfg.Topic == "" {
		return nil, errors.New("applier: topic is required")
	}
	if cfg.DLQ == nil {
		return nil, errors.New("applier: a DLQ writer is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = 10 * time.Second
	}
	if cfg.ClaimTimeout <= 0 {
		cfg.ClaimTimeout = 30 * time.Second
	}
	if cfg.MaxTablesPerFlow <= 0 {
		cfg.MaxTablesPerFlow = DefaultMaxTablesPerFlow
	}
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return nil, fmt.Errorf("applier: kafka client: %w", err)
	}
	a := &Applier{
		s: s, r: r, cfg: cfg, log: cfg.Logger.With("topic", cfg.Topic),
		cl: cl, adm: kadm.NewClient(cl),
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "flowlog",
			Name:      "ddl_applied_total",
			Help:      "DDL records handled, by op and result (applied, unchanged, skipped, rejected, invalid).",
		}, []string{"op", "result"}),
		done: map[int32]int64{},
		id:   instanceID(), sweepNow: true, acked: map[claimKey]bool{},
	}
	for _, op := range ddlOps {
		for _, res := range []string{"applied", "unchanged", "skipped", "rejected", "invalid"} {
			a.applied.WithLabelValues(op, res)
		}
	}
	cfg.DLQ.InitReasons(ReasonDDLInvalid, ReasonDDLRejected)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(a.applied); err != nil {
			cl.Close()
			return nil, fmt.Errorf("applier: register metrics: %w", err)
		}
	}
	return a, nil
}

// Close closes the applier's Kafka client. A CatchUp in flight fails.
func (a *Applier) Close() { a.cl.Close() }

// CatchUp is the DDL barrier: it lists the DDL topic's end offsets and
// handles every record below them (and any later one fetched on the way),
// then refreshes the registry if Redis may have changed. It returns the
// outcome of every valid record it handled since the last successful
// catch-up (outcomes of a catch-up that failed part way are kept and
// returned by the next one); Changed ones (a drop or replace in particular)
// are what the caller reacts to. When every partition is already handled up
// to its end offset and the registry is current, it costs one ListOffsets
// round trip.
//
// A nil error means the registry reflects every DDL below the end offsets:
// a registry refresh that failed is retried by the next catch-up before it
// can succeed, so no record is routed with a stale registry.
func (a *Applier) CatchUp(ctx context.Context) ([]Applied, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	listed, err := a.adm.ListEndOffsets(ctx, a.cfg.Topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("ddl catch-up: list end offsets of %s: %w", a.cfg.Topic, err)
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	if len(ends) == 0 {
		return nil, fmt.Errorf("ddl catch-up: topic %s has no partitions", a.cfg.Topic)
	}
	parts := make([]int32, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	a.sweepRejects(ctx, parts)
	if a.started && !a.reseek && !a.stale && a.caughtUp(ends) {
		return nil, nil
	}

	refresh := !a.started || a.stale
	if err := a.position(ctx, ends, &refresh); err != nil {
		return nil, err
	}
	a.started = true
	err = a.consume(ctx, ends, &a.pending, &refresh)
	if refresh {
		// Records were handled (here or by another instance): the
		// registry is stale until a refresh succeeds, even if this
		// catch-up stopped part way.
		a.stale = true
		if rerr := a.r.Refresh(ctx); rerr != nil {
			if err == nil {
				err = fmt.Errorf("ddl catch-up: %w", rerr)
			}
		} else {
			a.stale = false
		}
	}
	if err != nil {
		return nil, err
	}
	out := a.pending
	a.pending = nil
	return out, nil
}

// instanceID names one Applier for its DLQ claims: random, so that a
// restarted process does not take its predecessor's claims for its own.
func instanceID() string {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (a *Applier) caughtUp(ends map[int32]int64) bool {
	for p, end := range ends {
		if d, ok := a.done[p]; !ok || d < end {
			return false
		}
	}
	return true
}

// position reads the stored ddl:offset of every partition, starts consuming
// new partitions there (else at their start offset), and seeks partitions
// that another instance moved past us, or all of them after an error.
func (a *Applier) position(ctx context.Context, ends map[int32]int64, refresh *bool) error {
	stored := make(map[int32]int64, len(ends))
	var fresh []int32
	for p := range ends {
		off, ok, err := a.s.DDLOffset(ctx, a.cfg.Topic, p)
		if err != nil {
			return fmt.Errorf("ddl catch-up: %w", err)
		}
		if ok {
			stored[p] = off
		} else if _, known := a.done[p]; !known {
			fresh = append(fresh, p)
		}
	}
	if len(fresh) > 0 {
		starts, err := a.adm.ListStartOffsets(ctx, a.cfg.Topic)
		if err == nil {
			err = starts.Error()
		}
		if err != nil {
			return fmt.Errorf("ddl catch-up: list start offsets of %s: %w", a.cfg.Topic, err)
		}
		for _, p := range fresh {
			if o, ok := starts.Lookup(a.cfg.Topic, p); ok {
				stored[p] = o.Offset
			}
		}
	}
	add := map[int32]kgo.Offset{}
	seek := map[int32]kgo.EpochOffset{}
	for p := range ends {
		off := stored[p]
		d, known := a.done[p]
		switch {
		case !known:
			add[p] = kgo.NewOffset().At(off)
			a.done[p] = off
		case off > d:
			*refresh = true // another instance handled records: Redis changed
			a.done[p] = off
			seek[p] = kgo.EpochOffset{Epoch: -1, Offset: off}
		case a.reseek:
			seek[p] = kgo.EpochOffset{Epoch: -1, Offset: d}
		}
	}
	if len(add) > 0 {
		a.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{a.cfg.Topic: add})
	}
	if len(seek) > 0 {
		a.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{a.cfg.Topic: seek})
	}
	a.reseek = false
	return nil
}

// consume polls until every partition is handled up to its end offset.
func (a *Applier) consume(ctx context.Context, ends map[int32]int64, out *[]Applied, refresh *bool) error {
	for !a.caughtUp(ends) {
		pctx, cancel := context.WithTimeout(ctx, a.cfg.StallTimeout)
		fs := a.cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			a.reseek = true
			return fmt.Errorf("ddl catch-up: %w", err)
		}
		if fs.IsClientClosed() {
			return fmt.Errorf("ddl catch-up: %w", kgo.ErrClientClosed)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && ferr == nil {
				ferr = fmt.Errorf("ddl catch-up: fetch %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			a.reseek = true
			return ferr
		}
		if fs.NumRecords() == 0 {
			a.reseek = true
			return fmt.Errorf("ddl catch-up: no DDL record within %s below the end offsets of %s (transactional or compacted topic?)", a.cfg.StallTimeout, a.cfg.Topic)
		}
		var err error
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			for _, rec := range fp.Records {
				if err != nil {
					return
				}
				if rec.Offset < a.done[rec.Partition] {
					continue // stale: handled already
				}
				var res Applied
				var ok bool
				if res, ok, err = a.handle(ctx, rec); err != nil {
					a.reseek = true
					return
				}
				a.done[rec.Partition] = rec.Offset + 1
				if ok {
					*out = append(*out, res)
					*refresh = *refresh || res.Changed || res.Skipped
				}
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}
