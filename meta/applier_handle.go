package meta

import (
	"context"
	"errors"
	"fmt"

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

// reject sends rec to the DLQ and then advances its partition's ddl:offset
// past it, unless another instance already did (then it only counts a skip).
func (a *Applier) reject(ctx context.Context, rec *kgo.Record, pos DDLPosition, op, reason, result string, cause error) error {
	op = opLabel(op)
	off, ok, err := a.s.DDLOffset(ctx, pos.Topic, pos.Partition)
	if err != nil {
		return fmt.Errorf("ddl catch-up: %w", err)
	}
	if ok && off >= pos.NextOffset {
		a.applied.WithLabelValues(op, "skipped").Inc()
		return nil
	}
	if err := a.cfg.DLQ.Send(ctx, rec, reason, cause.Error()); err != nil {
		return fmt.Errorf("ddl catch-up: %w", err)
	}
	if err := a.s.AdvanceDDLOffset(ctx, pos); err != nil {
		return fmt.Errorf("ddl catch-up: %w", err)
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
	return nil
}

// opLabel bounds the op metric label to the known ops.
func opLabel(op string) string {
	switch op {
	case OpCreate, OpReplace, OpDrop, OpResume:
		return op
	}
	return "unknown"
}
