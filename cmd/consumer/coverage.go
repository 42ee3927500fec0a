package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// restorableTables picks, for every table of the flow (or of only), the
// coverage window that holds ts (DESIGN 7), capped at ts. Every table left
// out is named on stderr with the reason; leaving out all of them is an
// error.
func restorableTables(ctx context.Context, st flowStore, ref flowRef, only map[int64]bool, ts uint64) (map[int64]sink.TableWindow, error) {
	cur, hist, err := st.Windows(ctx, ref.ID)
	if err != nil {
		return nil, err
	}
	establishing, err := st.PendingAdded(ctx, ref.ID)
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
	for t := range only {
		if t >= 0 && t <= int64(^uint32(0)) {
			all[uint32(t)] = true
		}
	}
	out := map[int64]sink.TableWindow{}
	var left []string
	for _, t := range slices.Sorted(func(yield func(uint32) bool) {
		for t := range all {
			if !yield(t) {
				return
			}
		}
	}) {
		if only != nil && !only[int64(t)] {
			continue
		}
		w, ok := meta.WindowAt(cur, hist, t, ts)
		if !ok {
			left = append(left, fmt.Sprintf("table %d: %s", t, whyNot(cur, hist, establishing, t, ts)))
			continue
		}
		until := ts
		if w.Until != nil && *w.Until < until {
			until = *w.Until
		}
		out[int64(t)] = sink.TableWindow{Since: w.Since, Until: until}
	}
	for _, l := range left {
		fmt.Fprintf(os.Stderr, "left out %s\n", l)
	}
	if len(out) == 0 {
		if len(all) == 0 {
			return nil, fmt.Errorf("flow %s/%s (id %d) has no coverage window yet: nothing is restorable", ref.Catalog, ref.Name, ref.ID)
		}
		return nil, fmt.Errorf("no table of flow %s/%s (id %d) is restorable as of %d (%s): every table left out", ref.Catalog, ref.Name, ref.ID, ts, tsTime(ts))
	}
	return out, nil
}

// whyNot says why table t has no window holding ts.
func whyNot(cur map[uint32]meta.Window, hist []meta.Window, establishing map[uint32]bool, t uint32, ts uint64) string {
	var ws []string
	for _, w := range hist {
		if w.TableID == t {
			ws = append(ws, windowString(w))
		}
	}
	if w, ok := cur[t]; ok {
		ws = append(ws, windowString(w))
	}
	switch {
	case len(ws) > 0:
		return fmt.Sprintf("no coverage window holds %d; its windows are %s", ts, strings.Join(ws, ", "))
	case establishing[t]:
		return "its coverage window is not established yet (an apply partition has not routed past the DDL that added it)"
	}
	return "not a table of the flow (no coverage window)"
}

// windowString renders a window as [since, until] with "now" for an open
// end: the ts it holds.
func windowString(w meta.Window) string {
	until := "now"
	if w.Until != nil {
		until = strconv.FormatUint(*w.Until, 10)
	}
	return fmt.Sprintf("[%d, %s]", w.Since, until)
}

// flowWindows lists every coverage window of flow id, by table, oldest
// first.
func flowWindows(ctx context.Context, st flowStore, id meta.FlowID) ([]meta.Window, error) {
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
func lastWindowEnd(ctx context.Context, st flowStore, id meta.FlowID) (uint64, bool, error) {
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
