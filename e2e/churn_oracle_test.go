package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// The oracle of TestChurn. For every flow id the script created, live or
// dropped, it reads the coverage windows from Redis and checks them against
// the script's model, reads every referenced chunk and checks that each
// produced event inside a window (up to the flow's checkpoint) is there
// exactly once and nothing twice, runs verify, and restores at the
// checkpoint and two earlier ts: a table whose window holds T must equal the
// MVCC read of the produced events inside that window, every other table
// must be left out.

// churnEvent is one produced write-CF event.
type churnEvent struct {
	key, value string // data key (with ts) and write record
	ts         uint64
}

// churnData is what the load produced, by table, sorted by commit ts.
type churnData struct {
	muts   map[int64][]loadgen.Mutation
	writes map[int64][]churnEvent
	first  uint64 // the smallest commit ts of the load
}

func newChurnData(cfg loadgen.Config) churnData {
	d := churnData{muts: map[int64][]loadgen.Mutation{}, writes: map[int64][]churnEvent{}}
	for _, m := range loadgen.Mutations(cfg) {
		d.muts[m.Table] = append(d.muts[m.Table], m)
	}
	g := loadgen.New(cfg)
	for b, ok := g.Next(); ok; b, ok = g.Next() {
		for _, e := range b.Events {
			if e.CF != event.CFWrite {
				continue // lock-CF events are skipped; values are short, so no default CF
			}
			raw, ts, err := event.DecodeDataKey(e.Key)
			if err != nil {
				panic(fmt.Sprintf("loadgen produced an undecodable key %x: %v", e.Key, err))
			}
			table, _ := event.TableIDOfRaw(raw)
			d.writes[table] = append(d.writes[table], churnEvent{string(e.Key), string(e.Value), ts})
			if d.first == 0 || ts < d.first {
				d.first = ts
			}
		}
	}
	for t := range d.muts {
		sort.SliceStable(d.muts[t], func(i, j int) bool { return d.muts[t][i].CommitTS < d.muts[t][j].CommitTS })
		sort.SliceStable(d.writes[t], func(i, j int) bool { return d.writes[t][i].ts < d.writes[t][j].ts })
	}
	return d
}

// expect is the MVCC read of table as of ts using only the mutations inside
// w: for every key the newest put or delete with since < commit ts <=
// min(ts, until).
func (d churnData) expect(table int64, w meta.Window, ts uint64) map[string]loadgen.Row {
	upto := ts
	if w.Until != nil {
		upto = min(upto, *w.Until)
	}
	out := map[string]loadgen.Row{}
	for _, m := range d.muts[table] {
		if m.CommitTS > upto {
			break
		}
		if m.CommitTS <= w.Since {
			continue
		}
		if m.Delete {
			delete(out, string(m.RawKey))
		} else {
			out[string(m.RawKey)] = loadgen.Row{Value: m.Value, CommitTS: m.CommitTS}
		}
	}
	return out
}

// churnFlowReport is what the oracle did for one flow id.
type churnFlowReport struct {
	id         uint32
	checkpoint uint64
	windows    int
	metas      int
	entries    int // entries in referenced chunks
	inWindows  int // produced events inside the windows, each found once
	withData   int // windows with produced events inside
	restores   []string
}

func (r churnFlowReport) String() string {
	return fmt.Sprintf("flow %d: checkpoint %d, %d windows (%d with data), %d metas, %d entries, %d produced events inside windows; restores: %s",
		r.id, r.checkpoint, r.windows, r.withData, r.metas, r.entries, r.inWindows, strings.Join(r.restores, "; "))
}

// churnOracle checks one cluster after the churn.
type churnOracle struct {
	t      *testing.T
	c      *cluster
	store  *meta.Store
	bucket *cachedBucket
	data   churnData
	rng    *rand.Rand
	where  map[string]churnRecord // apply records by event key, read when needed
}

// checkFlow runs every check of flow f.
func (o *churnOracle) checkFlow(ctx context.Context, f *churnFlow) churnFlowReport {
	t := o.t
	rep := churnFlowReport{id: f.id}
	id := meta.FlowID(f.id)

	// The definition and the windows agree with the script.
	info, ok, err := o.store.FlowInfo(ctx, id)
	if err != nil {
		t.Fatalf("flow %d: %v", id, err)
	}
	if ok != f.live() {
		t.Errorf("flow %d (%s): in Redis %v, live in the script %v", id, f.name, ok, f.live())
	} else if ok {
		got := make([]int64, len(info.SourceTableIDs))
		for i, tb := range info.SourceTableIDs {
			got[i] = int64(tb)
		}
		slices.Sort(got)
		if info.FlowName != f.name || !slices.Equal(got, f.tables) {
			t.Errorf("flow %d: Redis holds %s on tables %v, the script left %s on %v", id, info.FlowName, got, f.name, f.tables)
		}
	}
	cur, hist, err := o.store.Windows(ctx, id)
	if err != nil {
		t.Fatalf("flow %d: %v", id, err)
	}
	windows := append(slices.Clone(hist), mapValues(cur)...)
	rep.windows = len(windows)
	count := map[int64]int{}
	for _, w := range windows {
		count[int64(w.TableID)]++
	}
	// A table gets at most one window per add: fewer when every partition
	// crossed its removal and its addition in one registry refresh (the
	// steps between are one change), and the history keeps only windows a
	// restore can choose.
	for tb, n := range f.adds {
		if count[tb] > n {
			t.Errorf("flow %d: table %d has %d coverage windows, the script added it %d times", id, tb, count[tb], n)
		}
	}
	for tb := range count {
		if f.adds[tb] == 0 {
			t.Errorf("flow %d: table %d has a coverage window but never was a table of the flow", id, tb)
		}
	}
	for tb, w := range cur {
		open := f.live() && slices.Contains(f.tables, int64(tb))
		if (w.Until == nil) != open {
			t.Errorf("flow %d: table %d's current window %s, but the table is in the flow: %v", id, tb, windowText(w), open)
		}
	}
	for _, w := range hist {
		if w.Until == nil {
			t.Errorf("flow %d: table %d has an open window %s in the history", id, w.TableID, windowText(w))
		}
	}

	// The checkpoint: flow:state while live, the global checkpoint object
	// once dropped.
	if f.live() {
		st, err := o.store.FlowState(ctx, id)
		if err != nil {
			t.Fatalf("flow %d: %v", id, err)
		}
		rep.checkpoint = st.CheckpointTS
	} else if ck, err := o.droppedCheckpoint(ctx, f); err == nil {
		rep.checkpoint = ck
	} else if !errors.Is(err, sink.ErrNotExist) {
		t.Fatalf("flow %d: %v", id, err)
	}

	// Every produced event inside a window is in exactly one referenced
	// chunk, and nothing is there twice.
	bk := o.scan(ctx, id)
	rep.metas, rep.entries = bk.metas, bk.entries
	missing, twice := 0, 0
	for _, w := range windows {
		before := rep.inWindows
		for _, e := range o.data.writes[int64(w.TableID)] {
			if e.ts > rep.checkpoint || !w.Contains(e.ts) {
				continue
			}
			rep.inWindows++
			switch n := bk.events[int64(w.TableID)][e.key+"\x00"+e.value]; {
			case n == 0:
				if missing++; missing <= 5 {
					t.Errorf("flow %d: table %d event at ts %d (window %s, checkpoint %d) is in no referenced chunk",
						id, w.TableID, e.ts, windowText(w), rep.checkpoint)
				}
			case n > 1:
				if twice++; twice <= 5 {
					t.Errorf("flow %d: table %d event at ts %d is in %d referenced chunks", id, w.TableID, e.ts, n)
				}
			}
		}
		if rep.inWindows > before {
			rep.withData++
		}
	}
	if missing+twice > 0 {
		t.Errorf("flow %d: %d of %d events inside the coverage windows missing, %d stored more than once", id, missing, rep.inWindows, twice)
		o.explainMissing(ctx, id, windows, rep.checkpoint, bk)
	}

	// verify agrees: every listed meta and chunk is there and sound.
	if bk.metas > 0 {
		res := oracleRun(t, "verify", o.c.oracleConn(), "--flow-id", strconv.FormatUint(uint64(id), 10))
		if res.code != 0 || !strings.Contains(res.out, "  OK\n") {
			t.Errorf("flow %d: consumer verify exited %d:\n%s", id, res.code, res.out)
		}
	}

	// Restores at the checkpoint and two earlier ts.
	switch {
	case rep.checkpoint == 0:
		res := o.restore(id, 0)
		if res.code == 0 {
			t.Errorf("flow %d has no checkpoint, yet restore succeeded:\n%s", id, res.out)
		}
		rep.restores = append(rep.restores, "no checkpoint: refused")
		return rep
	case !f.live() && bk.metas == 0:
		res := o.restore(id, 0)
		if res.code == 0 || !strings.Contains(res.out, "no committed backup") {
			t.Errorf("flow %d was dropped without a committed meta, restore exited %d:\n%s", id, res.code, res.out)
		}
		rep.restores = append(rep.restores, "no committed backup: refused")
		return rep
	}
	for _, ts := range o.restorePoints(windows, rep.checkpoint) {
		rep.restores = append(rep.restores, o.checkRestore(id, f, cur, hist, bk.firstWrite, ts))
	}
	return rep
}

// restorePoints are the checkpoint, the commit ts of a produced event
// inside a window (so the restore has data there), and either a window
// bound (since, since+1, until or until+1: where a table enters or leaves)
// or a random ts from shortly before the data to the checkpoint (which may
// fall between windows).
func (o *churnOracle) restorePoints(windows []meta.Window, ckpt uint64) []uint64 {
	points := []uint64{ckpt}
	var inside []uint64
	for _, w := range windows {
		for _, e := range o.data.writes[int64(w.TableID)] {
			if e.ts < ckpt && w.Contains(e.ts) {
				inside = append(inside, e.ts)
			}
		}
	}
	slices.Sort(inside)
	if len(inside) > 0 {
		points = append(points, inside[o.rng.IntN(len(inside))])
	}
	lo := o.data.first - 1
	var bounds []uint64
	for _, w := range windows {
		bounds = append(bounds, w.Since, w.Since+1)
		if w.Until != nil {
			bounds = append(bounds, *w.Until, *w.Until+1)
		}
	}
	bounds = slices.DeleteFunc(bounds, func(ts uint64) bool { return ts < lo || ts >= ckpt })
	switch {
	case len(bounds) > 0 && o.rng.IntN(2) == 0:
		points = append(points, bounds[o.rng.IntN(len(bounds))])
	case lo < ckpt:
		points = append(points, lo+o.rng.Uint64N(ckpt-lo))
	default:
		points = append(points, ckpt-1)
	}
	return points
}

// checkRestore restores flow id as of ts and checks the outcome; it returns
// a line for the report.
func (o *churnOracle) checkRestore(id meta.FlowID, f *churnFlow, cur map[uint32]meta.Window, hist []meta.Window, firstWrite, ts uint64) string {
	t := o.t
	// The tables restore knows of: those with a window (a table whose
	// addition and removal every partition crossed at once never had one).
	all := map[int64]bool{}
	for tb := range cur {
		all[int64(tb)] = true
	}
	for _, w := range hist {
		all[int64(w.TableID)] = true
	}
	held := map[int64]meta.Window{}
	for tb := range all {
		if w, ok := meta.WindowAt(cur, hist, uint32(tb), ts); ok {
			held[tb] = w
		}
	}
	res := o.restore(id, ts)
	for tb := range all {
		_, in := held[tb]
		if left := strings.Contains(res.out, fmt.Sprintf("left out table %d: ", tb)); left == in {
			t.Errorf("flow %d at %d: table %d is named left out: %v, its window holds the ts: %v\n%s", id, ts, tb, left, in, res.out)
		}
	}
	switch {
	case len(held) == 0:
		if res.code == 0 || !strings.Contains(res.out, "every table left out") {
			t.Errorf("flow %d at %d: no window holds the ts, restore exited %d:\n%s", id, ts, res.code, res.out)
		}
		return fmt.Sprintf("%d: all %d tables left out", ts, len(all))
	case firstWrite == 0 || firstWrite > ts:
		if res.code == 0 || !strings.Contains(res.out, "nothing to restore") {
			t.Errorf("flow %d at %d: the first backed-up write record is at %d, restore exited %d:\n%s", id, ts, firstWrite, res.code, res.out)
		}
		return fmt.Sprintf("%d: before the first write record", ts)
	case res.code != 0:
		t.Errorf("flow %d at %d: restore exited %d:\n%s", id, ts, res.code, res.out)
		return fmt.Sprintf("%d: failed", ts)
	}
	if strings.Contains(res.out, "keys left out") {
		t.Errorf("flow %d at %d: restore left out keys without a value, but every value is short:\n%s", id, ts, res.out)
	}
	keys := 0
	for tb := range all {
		path := filepath.Join(res.dir, strconv.FormatInt(tb, 10)+".jsonl")
		_, statErr := os.Stat(path)
		w, in := held[tb]
		if !in {
			if statErr == nil {
				t.Errorf("flow %d at %d: table %d is left out but restore wrote %s", id, ts, tb, path)
			}
			continue
		}
		if statErr != nil {
			t.Errorf("flow %d at %d: table %d (window %s) has no output: %v", id, ts, tb, windowText(w), statErr)
			continue
		}
		got := oracleReadRestore(t, path)
		want := o.data.expect(tb, w, ts)
		keys += len(got)
		if bad := churnDiff(got, want); bad != "" {
			t.Errorf("flow %d at %d: table %d (window %s) differs from the MVCC read inside the window: %s", id, ts, tb, windowText(w), bad)
		}
	}
	entries, err := os.ReadDir(res.dir)
	if err != nil {
		t.Fatalf("read restore output: %v", err)
	}
	for _, e := range entries {
		tb, err := strconv.ParseInt(strings.TrimSuffix(e.Name(), ".jsonl"), 10, 64)
		if err != nil || !all[tb] {
			t.Errorf("flow %d at %d: restore wrote %s, not a table of the flow", id, ts, e.Name())
		}
	}
	return fmt.Sprintf("%d: %d of %d tables, %d keys", ts, len(held), len(all), keys)
}

// churnDiff describes how got differs from want, "" if not at all.
func churnDiff(got, want map[string]loadgen.Row) string {
	var bad []string
	for k, w := range want {
		if g, ok := got[k]; !ok {
			bad = append(bad, fmt.Sprintf("key %x missing", k))
		} else if !bytes.Equal(g.Value, w.Value) || g.CommitTS != w.CommitTS {
			bad = append(bad, fmt.Sprintf("key %x at commit ts %d, want %d", k, g.CommitTS, w.CommitTS))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			bad = append(bad, fmt.Sprintf("key %x (commit ts %d) should not be there", k, g.CommitTS))
		}
	}
	if len(bad) == 0 {
		return ""
	}
	slices.Sort(bad)
	return fmt.Sprintf("%d keys of %d restored, %d expected: %s", len(bad), len(got), len(want), strings.Join(bad[:min(len(bad), 5)], "; "))
}

// churnRestore is a restore's exit code, combined output and directory.
type churnRestore struct {
	code int
	out  string
	dir  string
}

// restore runs `consumer restore --flow-id id` as of ts (0: the checkpoint).
func (o *churnOracle) restore(id meta.FlowID, ts uint64) churnRestore {
	dir := filepath.Join(o.t.TempDir(), "out")
	args := []string{"--flow-id", strconv.FormatUint(uint64(id), 10), "--out", dir, "--temp-dir", o.t.TempDir()}
	if ts != 0 {
		args = append(args, "--ts", strconv.FormatUint(ts, 10))
	}
	res := oracleRun(o.t, "restore", o.c.oracleConn(), args...)
	return churnRestore{code: res.code, out: res.out, dir: dir}
}

// droppedCheckpoint reads the global checkpoint object that holds a
// dropped flow's checkpoint (checkpointObjectTS).
func (o *churnOracle) droppedCheckpoint(ctx context.Context, f *churnFlow) (uint64, error) {
	ts, _, err := checkpointObjectTS(ctx, o.bucket, meta.DefaultCatalog, f.name, f.id)
	return ts, err
}

// checkpointObjectTS reads the checkpoint object of flow id (name, in
// catalog) of the e2e group "flowlog" on prefix "": layout v2's global
// object when the consumer wrote one, else the flow's own layout v1 object.
// It returns the object's name too.
func checkpointObjectTS(ctx context.Context, b sink.Bucket, catalog, name string, id uint32) (uint64, string, error) {
	obj := sink.CheckpointPathV2("", "flowlog")
	rc, err := b.Get(ctx, obj)
	if errors.Is(err, sink.ErrNotExist) {
		obj = sink.CheckpointPath("", catalog, name, "flowlog", id)
		rc, err = b.Get(ctx, obj)
	}
	if err != nil {
		return 0, obj, fmt.Errorf("checkpoint object %s: %w", obj, err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(rc)
	if err != nil {
		return 0, obj, fmt.Errorf("checkpoint object %s: %w", obj, err)
	}
	ts, err := sink.DecodeCheckpoint(raw)
	return ts, obj, err
}

func windowText(w meta.Window) string {
	if w.Until == nil {
		return fmt.Sprintf("(%d, now]", w.Since)
	}
	return fmt.Sprintf("(%d, %d]", w.Since, *w.Until)
}

func mapValues(m map[uint32]meta.Window) []meta.Window {
	out := make([]meta.Window, 0, len(m))
	for _, k := range slices.Sorted(func(yield func(uint32) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}) {
		out = append(out, m[k])
	}
	return out
}
