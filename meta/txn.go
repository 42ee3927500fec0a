package meta

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// ErrConflict is returned when a transaction's watched keys kept changing
// under it for every one of its bounded retries.
var ErrConflict = errors.New("meta: transaction conflict after retries")

// maxTxnAttempts bounds how often one transaction is tried from its read.
const maxTxnAttempts = 16

// TxnFunc is one attempt of a compare-and-swap: it reads through tx (the
// WATCHed connection) and returns the writes to queue in MULTI/EXEC, or nil
// writes to finish without writing. It must not have side effects outside
// Redis, because a failed EXEC runs it again.
type TxnFunc func(ctx context.Context, tx *redis.Tx) (writes func(redis.Pipeliner) error, err error)

// txner runs WATCH -> read/compare -> MULTI/EXEC with bounded, jittered
// retries. Only a failed EXEC (a watched key changed: redis.TxFailedErr) is
// retried; any other error ends the transaction.
type txner struct {
	rdb     redis.UniversalClient
	retries *prometheus.CounterVec
}

func newTxner(rdb redis.UniversalClient, reg prometheus.Registerer) *txner {
	t := &txner{
		rdb: rdb,
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "flowlog",
			Name:      "redis_txn_retries_total",
			Help:      "Redis WATCH/MULTI transactions retried because a watched key changed, by operation.",
		}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(t.retries)
	}
	return t
}

// run executes fn as a transaction watching keys. op labels the retry metric
// and errors.
func (t *txner) run(ctx context.Context, op string, keys []string, fn TxnFunc) error {
	backoff := time.Millisecond
	for attempt := 1; ; attempt++ {
		err := t.rdb.Watch(ctx, func(tx *redis.Tx) error {
			writes, err := fn(ctx, tx)
			if err != nil || writes == nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, writes)
			return err
		}, keys...)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
		t.retries.WithLabelValues(op).Inc()
		if attempt == maxTxnAttempts {
			return fmt.Errorf("%s: %w", op, ErrConflict)
		}
		sleep := backoff/2 + rand.N(backoff)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", op, ctx.Err())
		case <-time.After(sleep):
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}
