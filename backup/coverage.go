package backup

import (
	"cmp"
	"context"
	"slices"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// restorable picks, for every table of f that sel selects, the coverage window
// that holds ts, capped at ts: the part of the table's log a restore at ts
// reads. Every table left out is reported as a LeftOut event, in table
// order; leaving out all of them fails with an *UncoveredError. ckpt is the
// flow's checkpoint as the ts was checked against it.
//
// A table being removed (a pending step removes it: the DDL is applied, not
// every apply partition has reported where it stopped routing the table) is
// restorable from its open window only up to the flow's checkpoint when the
// DDL was applied, which the step records: a partition that stopped no
// longer backs the table up while the checkpoint moves on, but everything
// up to that checkpoint was committed while every partition still routed
// the table (meta.Store.PendingRemoved). Past it, or if the recorded checkpoint is
// past the flow's own (which only a checkpoint no clock could give moved
// there), the table is left out until the step is final.
func restorable(ctx context.Context, st Store, f Flow, sel Selection, ts, ckpt uint64, notify func(Event)) (map[int64]sink.TableWindow, error) {
	cur, hist, err := st.Windows(ctx, f.ID)
	if err != nil {
		return nil, err
	}
	establishing, err := st.PendingAdded(ctx, f.ID)
	if err != nil {
		return nil, err
	}
	removing, err := st.PendingRemoved(ctx, f.ID)
	if err != nil {
		return nil, err
	}
	all := map[uint32]bool{}
	for t := range cur {
		all[t] = true
	}
	for _, w := range hist {
		all[w.TableID] = true
	}
	for t := range establishing {
		all[t] = true
	}
	for t := range sel.Tables {
		if t >= 0 && t <= int64(^uint32(0)) {
			all[uint32(t)] = true
		}
	}
	out := map[int64]sink.TableWindow{}
	var left []LeftOut
	for _, t := range slices.Sorted(func(yield func(uint32) bool) {
		for t := range all {
			if !yield(t) {
				return
			}
		}
	}) {
		if !sel.HasTable(int64(t)) {
			continue // not selected: neither restored nor left out
		}
		w, ok := meta.WindowAt(cur, hist, t, ts)
		if !ok {
			left = append(left, LeftOut{Table: t, TS: ts, Windows: tableWindows(cur, hist, t), Establishing: establishing[t]})
			continue
		}
		if c, pending := removing[t]; pending && w.Until == nil && (ts > c || c > ckpt) {
			left = append(left, LeftOut{Table: t, TS: ts, Windows: tableWindows(cur, hist, t), Removing: true, CompleteUpTo: min(c, ckpt)})
			continue
		}
		until := ts
		if w.Until != nil && *w.Until < until {
			until = *w.Until
		}
		out[int64(t)] = sink.TableWindow{Since: w.Since, Until: until}
	}
	for _, l := range left {
		report(notify, l)
	}
	if len(out) == 0 {
		return nil, &UncoveredError{Flow: f, TS: ts, NoWindow: len(all) == 0}
	}
	return out, nil
}

// tableWindows returns table t's windows, the older ones first.
func tableWindows(cur map[uint32]meta.Window, hist []meta.Window, t uint32) []meta.Window {
	var ws []meta.Window
	for _, w := range hist {
		if w.TableID == t {
			ws = append(ws, w)
		}
	}
	if w, ok := cur[t]; ok {
		ws = append(ws, w)
	}
	return ws
}

// Windows lists every coverage window of flow id, by table, oldest first.
func Windows(ctx context.Context, st Store, id meta.FlowID) ([]meta.Window, error) {
	cur, hist, err := st.Windows(ctx, id)
	if err != nil {
		return nil, err
	}
	out := append([]meta.Window{}, hist...)
	for _, w := range cur {
		out = append(out, w)
	}
	slices.SortStableFunc(out, func(a, b meta.Window) int { return cmp.Compare(a.TableID, b.TableID) })
	return out, nil
}

// lastWindowEnd is the latest until of flow id's current windows, and false
// if one of them is still open or there is none.
func lastWindowEnd(ctx context.Context, st Store, id meta.FlowID) (uint64, bool, error) {
	cur, _, err := st.Windows(ctx, id)
	if err != nil || len(cur) == 0 {
		return 0, false, err
	}
	var end uint64
	for _, w := range cur {
		if w.Until == nil {
			return 0, false, nil
		}
		end = max(end, *w.Until)
	}
	return end, true, nil
}
