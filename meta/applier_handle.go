package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// handle applies one DDL record. It returns the outcome and true for a
// valid record; false with a nil error for one that went to the DLQ; an
// error (nothing skipped, the record must be handled again) when Redis or
// Kafka failed.
func (a *Applier) handle(ctx context.Context, rec *kgo.Record) (Applied, bool, error) {
	pos := DDLPosition{Topic: rec.Topic, Partition: rec.Partition, NextOffset: rec.Offset + 1}
	d, err := ParseDDL(rec.Value)
	if err != nil {
		return Applied{}, false, a.reject(ctx, rec, pos, "unknown", ReasonDDLInvalid, "invalid", err)
	}
	if n := len(d.Flow.SourceTableIDs); (d.Op == OpCreate || d.Op == OpReplace) && n > a.cfg.MaxTablesPerFlow {
		err := fmt.Errorf("flow %s/%s: %d source tables, at most %d: %w", d.Flow.CatalogName, d.Flow.FlowName, n, a.cfg.MaxTablesPerFlow, ErrTooManyTables)
		return Applied{}, false, a.reject(ctx, rec, pos, d.Op, ReasonDDLRejected, "rejected", err)
	}
	res, err := a.s.ApplyDDL(ctx, d, pos)
	var verr *ValidationError
	switch {
	case err == nil:
	case errors.As(err, &verr):
		return Applied{}, false, a.reject(ctx, rec, pos, d.Op, ReasonDDLInvalid, "invalid", err)
	case errors.Is(err, ErrFlowAlreadyExists), errors.Is(err, ErrFlowNotFound),
		errors.Is(err, ErrDifferentFlowID), errors.Is(err, ErrUnexpectedValue), errors.Is(err, ErrFlowIDInUse):
		return Applied{}, false, a.reject(ctx, rec, pos, d.Op, ReasonDDLRejected, "rejected", err)
	default:
		return Applied{}, false, fmt.Errorf("ddl catch-up: record %s/%d@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	result := "unchanged"
	switch {
	case res.Skipped:
		result = "skipped"
	case res.Changed:
		result = "applied"
	}
	a.applied.WithLabelValues(opLabel(res.Op), result).Inc()
	if !res.Skipped {
		a.log.Info("flow ddl applied", "op", res.Op, "catalog", res.Catalog, "flow", res.Name,
			"flow_id", res.FlowID, "changed", res.Changed, "partition", rec.Partition, "offset", rec.Offset)
	}
	return res, true, nil
}

// reject hands rec to the DLQ exactly once across every instance: it
// claims the record in Redis (ClaimDDLReject advances its partition's
// ddl:offset in the same MULTI), and only the instance whose claim went
// through counts it and sends the DLQ record; the others count a skip. A
// send that fails leaves the claim for sweepRejects to retry, so the
// catch-up goes on (the claim, not the offset, keeps the DLQ record owed).
func (a *Applier) reject(ctx context.Context, rec *kgo.Record, pos DDLPosition, op, reason, result string, cause error) error {
	op = opLabel(op)
	claim := RejectedDDL{Topic: pos.Topic, Partition: pos.Partition, Offset: pos.NextOffset - 1, Owner: a.id,
		Reason: reason, Detail: cause.Error(), Key: rec.Key, Value: rec.Value}
	for _, h := range rec.Headers {
		claim.Headers = append(claim.Headers, RecordHeader{Key: h.Key, Value: h.Value})
	}
	won, err := a.s.ClaimDDLReject(ctx, claim)
	if err != nil {
		return fmt.Errorf("ddl catch-up: %w", err)
	}
	if !won {
		a.applied.WithLabelValues(op, "skipped").Inc()
		return nil
	}
	a.applied.WithLabelValues(op, result).Inc()
	// An invalid record's cause may quote parts of its value: only the
	// reason and position are logged, the DLQ record carries the detail. A
	// rejection's cause is the metadata's answer (flow already exists, ...)
	// and is what the operator needs to see.
	attrs := []any{"reason", reason, "op", op, "partition", rec.Partition, "offset", rec.Offset}
	if reason == ReasonDDLRejected {
		attrs = append(attrs, "err", cause)
	}
	a.log.Warn("flow ddl sent to the DLQ", attrs...)
	a.sendClaimed(ctx, claim)
	return nil
}

// sendClaimed produces the DLQ record of a claim this instance holds and
// deletes the claim. On failure the claim stays and the next sweep retries:
// the send if the DLQ did not acknowledge it, else only the delete (a
// Redis outage between the two must not send the record again). The send
// is bounded by half the takeover time, so that another instance takes over
// only a claim whose owner is gone or hopelessly stuck.
func (a *Applier) sendClaimed(ctx context.Context, c RejectedDDL) {
	key := claimKey{c.Topic, c.Partition, c.Offset}
	var err error
	if !a.acked[key] {
		src := &kgo.Record{Topic: c.Topic, Partition: c.Partition, Offset: c.Offset, Key: c.Key, Value: c.Value}
		for _, h := range c.Headers {
			src.Headers = append(src.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		sctx, cancel := context.WithTimeout(ctx, a.cfg.ClaimTimeout/2)
		err = a.cfg.DLQ.Send(sctx, src, c.Reason, c.Detail)
		cancel()
		if err == nil {
			a.acked[key] = true
		}
	}
	if err == nil {
		if err = a.s.DoneDDLReject(ctx, c); err == nil {
			delete(a.acked, key)
			return
		}
	}
	a.sweepNow = true
	if ctx.Err() == nil {
		a.log.Warn("sending a rejected flow ddl to the DLQ failed; its claim in Redis keeps it owed, retrying",
			"partition", c.Partition, "offset", c.Offset, "dlq_acked", a.acked[key], "err", err)
	}
}

// claimKey names a claimed DDL record.
type claimKey struct {
	topic     string
	partition int32
	offset    int64
}

// sweepRejects sends the DLQ records still owed: claims of this instance
// whose send failed, and claims of other instances older than
// ClaimTimeout (their owner crashed between claim and send). It runs on
// the first catch-up, after a failed send, and every ClaimTimeout/3; its
// errors are logged and it is tried again.
func (a *Applier) sweepRejects(ctx context.Context, partitions []int32) {
	if !a.sweepNow && time.Since(a.lastSweep) < a.cfg.ClaimTimeout/3 {
		return
	}
	a.sweepNow, a.lastSweep = false, time.Now()
	for _, p := range partitions {
		pending, err := a.s.PendingDDLRejects(ctx, a.cfg.Topic, p)
		if err != nil {
			a.sweepNow = true
			a.log.Warn("reading owed DLQ records of flow ddl failed; retrying", "partition", p, "err", err)
			continue
		}
		for k := range a.acked { // deleted by another instance meanwhile
			if k.partition == p && !slices.ContainsFunc(pending, func(c RejectedDDL) bool { return c.Offset == k.offset }) {
				delete(a.acked, k)
			}
		}
		for _, c := range pending {
			taken, ok, err := a.s.TakeOverDDLReject(ctx, c, a.id, a.cfg.ClaimTimeout)
			if err != nil {
				a.sweepNow = true
				a.log.Warn("taking over an owed DLQ record of flow ddl failed; retrying", "partition", p, "offset", c.Offset, "err", err)
				continue
			}
			if !ok {
				continue
			}
			if c.Owner != a.id {
				a.log.Warn("sending a rejected flow ddl to the DLQ for an instance that claimed it and did not finish",
					"partition", p, "offset", c.Offset, "owner", c.Owner)
			}
			a.sendClaimed(ctx, taken)
		}
	}
}

// opLabel bounds the op metric label to the known ops.
func opLabel(op string) string {
	switch op {
	case OpCreate, OpReplace, OpDrop, OpResume:
		return op
	}
	return "unknown"
}
