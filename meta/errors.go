package meta

import (
	"errors"
	"fmt"
)

// Errors of the flow metadata transactions that callers branch on. A DDL
// that fails with one of them is a semantic rejection: it goes to the DLQ
// and its offset advances. ErrConflict (txn.go) is the fourth: the watched
// keys kept changing for every bounded retry, a transient failure.
var (
	// ErrFlowAlreadyExists is returned by a create whose name maps to
	// another flow id (and, for a DDL, when if_not_exists is not set).
	ErrFlowAlreadyExists = errors.New("meta: flow already exists")
	// ErrFlowNotFound is returned when an operation needs a flow that does
	// not exist.
	ErrFlowNotFound = errors.New("meta: flow not found")
	// ErrDifferentFlowID is returned by an update whose flow name maps to a
	// different flow id than the one being updated.
	ErrDifferentFlowID = errors.New("meta: name maps to a different flow id")
	// ErrFlowIDInUse is returned by a create that names the id of a flow
	// that exists or existed (its metas or coverage key is present): flow
	// ids are never reused, since a new flow under a dropped flow's id would
	// read the old flow's backup as its own (docs/FORMAT.md, "FlowDDL
	// records").
	ErrFlowIDInUse = errors.New("meta: flow id in use or used before")
	// ErrTooManyTables refuses a create or replace with more source tables
	// than the Applier's MaxTablesPerFlow (--max-tables-per-flow).
	ErrTooManyTables = errors.New("meta: more source tables than --max-tables-per-flow")
	// ErrUnexpectedValue matches every *UnexpectedValueError with errors.Is.
	ErrUnexpectedValue = errors.New("meta: unexpected value")
)

// UnexpectedValueError reports that a stored value differs from the one a
// compare-and-swap expected, e.g. a create of an existing flow id with
// different info, or an update whose current info is stale.
type UnexpectedValueError struct {
	Key      string // Redis key compared
	Expected string // value the caller expected ("" for absent)
	Actual   string // value found ("" for absent)
}

// Error describes the key and both values.
func (e *UnexpectedValueError) Error() string {
	return fmt.Sprintf("meta: unexpected value at %s: expected %s, actual %s",
		e.Key, orAbsent(e.Expected), orAbsent(e.Actual))
}

// Is makes errors.Is(err, ErrUnexpectedValue) true.
func (e *UnexpectedValueError) Is(target error) bool { return target == ErrUnexpectedValue }

func orAbsent(s string) string {
	if s == "" {
		return "<absent>"
	}
	return s
}
