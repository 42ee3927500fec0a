package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/meta"
)

// reader is how `consumer restore` and `consumer snapshot` word what the
// read side reports and refuses.
type reader struct {
	ts     *tsFlag // --ts
	verb   string  // the work, in a note: "restoring"
	noun   string  // the work, in a refusal: "restore"
	tables string  // --tables, "" for all
	out    *output
	// leftOut are the tables left out, for the JSON form.
	leftOut []leftOut
}

// leftOut is a table a restore or snapshot left out, and why.
type leftOut struct {
	Table  uint32 `json:"table"`
	Reason string `json:"reason"`
}

// flowJSON is a flow in every JSON document.
type flowJSON struct {
	ID      uint32 `json:"id"`
	Catalog string `json:"catalog"`
	Name    string `json:"name"`
	Dropped bool   `json:"dropped"`
}

func flowOf(f backup.Flow) flowJSON {
	return flowJSON{ID: uint32(f.ID), Catalog: f.Catalog, Name: f.Name, Dropped: f.Dropped}
}

// notify prints an event of the request: notes on stdout (not with
// --json), what is left out and why on stderr.
func (r *reader) notify(e backup.Event) {
	switch e := e.(type) {
	case backup.CheckpointUnreadable:
		fmt.Fprintf(os.Stderr, "flow %s/%s (id %d) was dropped and its checkpoint is unreadable (%v); its coverage windows are final, so it is restorable up to their end\n",
			e.Flow.Catalog, e.Flow.Name, e.Flow.ID, e.Err)
	case backup.AtWindowsEnd:
		r.out.printf("flow %s/%s (id %d) was dropped: %s as of the end of its last coverage window, %d (%s)\n",
			e.Flow.Catalog, e.Flow.Name, e.Flow.ID, r.verb, e.End, tsTime(e.End))
	case backup.TSChosen:
		if r.ts.form != "" {
			r.out.printf("--ts %s\n", r.ts.describe())
		}
	case backup.LeftOut:
		why := whyNot(e)
		r.leftOut = append(r.leftOut, leftOut{Table: e.Table, Reason: why})
		fmt.Fprintf(os.Stderr, "left out table %d: %s\n", e.Table, why)
	}
}

// whyNot says why table l.Table has no window holding l.TS.
func whyNot(l backup.LeftOut) string {
	switch {
	case l.Removing:
		return fmt.Sprintf("it is being removed from the flow and not every apply partition has said where it stopped backing it up: its window is complete only up to %d (%s), the flow's checkpoint when it was removed; restore at or below that, or once the removal is final",
			l.CompleteUpTo, tsTime(l.CompleteUpTo))
	case len(l.Windows) > 0:
		ws := make([]string, len(l.Windows))
		for i, w := range l.Windows {
			ws[i] = windowString(w)
		}
		return fmt.Sprintf("no coverage window holds %s; its windows are %s", tsText(l.TS), strings.Join(ws, ", "))
	case l.Establishing:
		return "its coverage window is not established yet (an apply partition has not routed past the DDL that added it)"
	}
	return "not a table of the flow (no coverage window)"
}

// windowString renders a window as [since (time), until (time)] with "now"
// for an open end: the ts it holds, each TSO with its wall time.
func windowString(w meta.Window) string {
	until := "now"
	if w.Until != nil {
		until = tsText(*w.Until)
	}
	return "[" + tsText(w.Since) + ", " + until + "]"
}

// tsText is a TSO with its wall time, "N (2026-12-01T10:00:00Z)"; 0, which
// is no time, is "0".
func tsText(ts uint64) string {
	if ts == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", ts, tsTime(ts))
}

// explain words the read side's refusals for the operator, naming the
// flags that change them; other errors pass unchanged.
func (r *reader) explain(err error) error {
	var (
		nf *backup.NotFoundError
		op *backup.OutsidePrefixError
		fe *backup.FutureError
		nc *backup.NoCheckpointError
		pc *backup.PastCheckpointError
		te *backup.TruncatedError
		un *backup.UncoveredError
		nd *backup.NoDataError
	)
	switch {
	case errors.As(err, &nf), errors.As(err, &op):
		return explainLookup(err)
	case errors.As(err, &fe):
		what := "--ts " + r.ts.describe()
		if fe.Checkpoint {
			what = fmt.Sprintf("the checkpoint of flow %s/%s (id %d)", fe.Flow.Catalog, fe.Flow.Name, fe.Flow.ID)
		}
		return fmt.Errorf("%s is %d (%s), %v ahead of this machine's clock, more than --max-clock-skew %v: refused, nothing past the clock can be backed up yet (a producer clock far ahead, or a corrupted heartbeat; see docs/OPERATING.md, \"Time is bounded\")",
			what, fe.TS, tsTime(fe.TS), fe.Ahead.Round(time.Second), fe.Skew)
	case errors.As(err, &nc):
		return fmt.Errorf("flow %s/%s (id %d) has no checkpoint yet: nothing is restorable", nc.Flow.Catalog, nc.Flow.Name, nc.Flow.ID)
	case errors.As(err, &pc):
		return fmt.Errorf("--ts %s is past the flow's checkpoint %d (%s): later data may still be incomplete", r.ts.describe(), pc.Checkpoint, tsTime(pc.Checkpoint))
	case errors.As(err, &te):
		f := te.Flow
		switch {
		case te.Table < 0:
			return fmt.Errorf("--ts %d (%s) is before the truncation point of flow %s/%s (id %d): the log before it was removed; the oldest restorable ts is %d (%s)",
				te.TS, tsTime(te.TS), f.Catalog, f.Name, f.ID, te.TruncatedBefore, tsTime(te.TruncatedBefore))
		case te.LogOnly:
			return fmt.Errorf("table %d of flow %s/%s (id %d) cannot be restored from the log alone (--snapshots=false): the log before the truncation point %d (%s) was removed",
				te.Table, f.Catalog, f.Name, f.ID, te.TruncatedBefore, tsTime(te.TruncatedBefore))
		}
		return fmt.Errorf("table %d of flow %s/%s (id %d) cannot be restored as of %d: the log before the truncation point %d (%s) was removed and no listed snapshot at or after it holds the table's coverage window (restore the other tables with --tables)",
			te.Table, f.Catalog, f.Name, f.ID, te.TS, te.TruncatedBefore, tsTime(te.TruncatedBefore))
	case errors.As(err, &un) && un.NoWindow:
		return fmt.Errorf("flow %s/%s (id %d) has no coverage window yet: nothing is restorable", un.Flow.Catalog, un.Flow.Name, un.Flow.ID)
	case errors.As(err, &un):
		return fmt.Errorf("no table of flow %s/%s (id %d) is restorable as of %d (%s): every table left out", un.Flow.Catalog, un.Flow.Name, un.Flow.ID, un.TS, tsTime(un.TS))
	case errors.As(err, &nd) && nd.First == 0:
		return fmt.Errorf("flow %s/%s (id %d) has no backed-up write record%s: nothing to %s", nd.Flow.Catalog, nd.Flow.Name, nd.Flow.ID, tablesNote(r.tables), r.noun)
	case errors.As(err, &nd):
		return fmt.Errorf("--ts %d (%s) is before the first backed-up write record%s of flow %s/%s at %d (%s): nothing to %s",
			nd.TS, tsTime(nd.TS), tablesNote(r.tables), nd.Flow.Catalog, nd.Flow.Name, nd.First, tsTime(nd.First), r.noun)
	}
	return err
}

// explainLookup words a failed flow lookup.
func explainLookup(err error) error {
	var (
		nf *backup.NotFoundError
		op *backup.OutsidePrefixError
	)
	switch {
	case errors.As(err, &nf) && nf.Lookup.Name != "":
		return fmt.Errorf("no flow %s/%s (use --flow-id for a dropped flow)", nf.Lookup.Catalog, nf.Lookup.Name)
	case errors.As(err, &nf):
		return fmt.Errorf("flow %d: no such flow and no committed backup", nf.Lookup.ID)
	case errors.As(err, &op):
		return fmt.Errorf("flow %d: meta path %s is not under --gcs-prefix %q", op.ID, op.Path, op.Prefix)
	}
	return err
}

func tablesNote(tables string) string {
	if tables == "" {
		return ""
	}
	return " of tables " + tables
}
