package e2e

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The DDL script of TestChurn: a seeded sequence of flow DDL over a few
// names, generated against a model of the flow metadata (docs/FORMAT.md,
// "FlowDDL records") that also says what each DDL must do: which flow id a
// create takes (flow:seq counts up, ids are never reused), which DDL the
// consumer must reject to the DLQ, and which tables every flow id ever had.

// Kinds of script steps. Every kind occurs at least once in a script.
const (
	ddlCreate         = "create"                       // a free name
	ddlCreateINENew   = "create --if-not-exists (new)" // a free name: creates
	ddlCreateINEExist = "create --if-not-exists (existing)"
	ddlCreateExisting = "create of an existing name"    // rejected
	ddlCreateUsedID   = "create --flow-id of a used id" // rejected
	ddlReplaceAdd     = "replace adding tables"
	ddlReplaceRemove  = "replace removing tables"
	ddlReplaceSwap    = "replace adding and removing tables"
	ddlReplaceMissing = "replace of a missing flow" // creates
	ddlDrop           = "drop"
	ddlDropMissing    = "drop of a missing flow" // succeeds unchanged
	ddlRecreateSame   = "re-create of a dropped name, same tables"
	ddlRecreateOther  = "re-create of a dropped name, other tables"
	ddlResume         = "resume of an active flow" // succeeds unchanged
	ddlResumeMissing  = "resume of a missing flow" // rejected
)

var ddlKinds = []string{ddlCreate, ddlCreateINENew, ddlCreateINEExist, ddlCreateExisting, ddlCreateUsedID,
	ddlReplaceAdd, ddlReplaceRemove, ddlReplaceSwap, ddlReplaceMissing, ddlDrop, ddlDropMissing,
	ddlRecreateSame, ddlRecreateOther, ddlResume, ddlResumeMissing}

// churnTables are the tables the load writes and flows pick from.
var churnTables = []int64{1, 2, 3, 4, 5, 6}

// churnNames are the flow names of a script.
var churnNames = []string{"c0", "c1", "c2", "c3", "c4"}

// churnDDL is one step of the script and what the model says it does.
type churnDDL struct {
	step        int
	kind        string
	op          string
	name        string
	tables      []int64 // create and replace
	ifNotExists bool
	flowID      uint32 // explicit --flow-id; 0: none

	reject bool   // must go to the DLQ
	newID  uint32 // flow id the step creates; 0: none
	offset int64  // offset in the DDL topic, once published
}

// args is the `producer flow` command line of d (without the brokers).
func (d *churnDDL) args() []string {
	a := []string{"flow", d.op, "--name", d.name}
	if len(d.tables) > 0 {
		a = append(a, "--tables", tableList(d.tables))
	}
	if d.ifNotExists {
		a = append(a, "--if-not-exists")
	}
	if d.flowID != 0 {
		a = append(a, "--flow-id", strconv.FormatUint(uint64(d.flowID), 10))
	}
	return a
}

func (d *churnDDL) String() string {
	s := fmt.Sprintf("step %d: %s (%s)", d.step, strings.Join(d.args(), " "), d.kind)
	switch {
	case d.reject:
		s += ": rejected"
	case d.newID != 0:
		s += fmt.Sprintf(": flow id %d", d.newID)
	}
	return s
}

func tableList(ts []int64) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = strconv.FormatInt(t, 10)
	}
	return strings.Join(s, ",")
}

// churnFlow is one flow id of the script as the model knows it.
type churnFlow struct {
	id      uint32
	name    string
	created int           // step
	dropped int           // step; -1 while live
	tables  []int64       // current (live) or at the drop
	adds    map[int64]int // times each table was added: its coverage windows
}

func (f *churnFlow) live() bool { return f.dropped < 0 }

// churnModel is the flow metadata as the script's DDL leave it.
type churnModel struct {
	live    map[string]*churnFlow // by name
	dropped map[string]*churnFlow // the last dropped flow of a name now free
	flows   []*churnFlow          // by id - 1
}

func newChurnModel() *churnModel {
	return &churnModel{live: map[string]*churnFlow{}, dropped: map[string]*churnFlow{}}
}

// create records a new flow of name.
func (m *churnModel) create(step int, name string, tables []int64) uint32 {
	f := &churnFlow{id: uint32(len(m.flows) + 1), name: name, created: step, dropped: -1,
		tables: slices.Clone(tables), adds: map[int64]int{}}
	for _, t := range tables {
		f.adds[t]++
	}
	m.flows = append(m.flows, f)
	m.live[name] = f
	delete(m.dropped, name)
	return f.id
}

// apply updates the model with d and fills in what d must do.
func (m *churnModel) apply(d *churnDDL) {
	f := m.live[d.name]
	switch d.op {
	case "create":
		switch {
		case f != nil && d.ifNotExists:
		case f != nil, d.flowID != 0:
			d.reject = true
		default:
			d.newID = m.create(d.step, d.name, d.tables)
		}
	case "replace":
		if f == nil {
			d.newID = m.create(d.step, d.name, d.tables)
			return
		}
		for _, t := range d.tables {
			if !slices.Contains(f.tables, t) {
				f.adds[t]++
			}
		}
		f.tables = slices.Clone(d.tables)
	case "drop":
		if f != nil {
			f.dropped = d.step
			delete(m.live, d.name)
			m.dropped[d.name] = f
		}
	case "resume":
		d.reject = f == nil
	}
}

// churnScript generates a script of n steps (n >= 2*len(ddlKinds)) with
// every kind at least once; the first two steps create flows before the
// load starts.
func churnScript(rng *rand.Rand, n int) ([]*churnDDL, *churnModel) {
	m := newChurnModel()
	var script []*churnDDL
	done := map[string]bool{}
	for step := range n {
		var d *churnDDL
		if step < 2 {
			d = &churnDDL{kind: ddlCreate, op: "create", name: churnNames[step], tables: pickTables(rng, 2, 3, nil)}
		} else {
			var missing []string
			for _, k := range ddlKinds {
				if !done[k] {
					missing = append(missing, k)
				}
			}
			// Kinds not done yet come first while the rest of the script
			// is short, and otherwise half of the time.
			if len(missing) > 0 && (n-step <= 2*len(missing) || rng.IntN(2) == 0) {
				rng.Shuffle(len(missing), func(i, j int) { missing[i], missing[j] = missing[j], missing[i] })
				for _, k := range missing {
					if d = m.propose(rng, step, k); d != nil {
						break
					}
				}
				// None fits now: creates need fewer live flows and
				// re-creates a dropped name, which a drop gives.
				if d == nil {
					d = m.propose(rng, step, ddlDrop)
				}
			}
			for d == nil {
				d = m.propose(rng, step, weightedKind(rng))
			}
		}
		d.step = step
		m.apply(d)
		if d.reject && d.kind != ddlCreateExisting && d.kind != ddlCreateUsedID && d.kind != ddlResumeMissing {
			panic(fmt.Sprintf("churn script: %s rejected", d)) // a bug of propose
		}
		done[d.kind] = true
		script = append(script, d)
	}
	return script, m
}

// weightedKind picks a kind for a step past the required ones.
func weightedKind(rng *rand.Rand) string {
	weights := []struct {
		kind string
		w    int
	}{
		{ddlReplaceAdd, 6}, {ddlReplaceRemove, 6}, {ddlReplaceSwap, 3}, {ddlDrop, 4}, {ddlCreate, 2},
		{ddlRecreateSame, 2}, {ddlRecreateOther, 2}, {ddlResume, 1}, {ddlCreateINEExist, 1},
		{ddlCreateExisting, 1}, {ddlDropMissing, 1}, {ddlReplaceMissing, 1}, {ddlCreateINENew, 1},
	}
	total := 0
	for _, w := range weights {
		total += w.w
	}
	x := rng.IntN(total)
	for _, w := range weights {
		if x < w.w {
			return w.kind
		}
		x -= w.w
	}
	return ddlReplaceAdd
}

// propose returns a step of kind that fits the model's state, or nil. At
// most four flows are live and at least one is.
func (m *churnModel) propose(rng *rand.Rand, step int, kind string) *churnDDL {
	live := sortedKeys(m.live)
	dropped := sortedKeys(m.dropped)
	var free []string // names of no live flow
	for _, n := range churnNames {
		if m.live[n] == nil {
			free = append(free, n)
		}
	}
	pick := func(names []string) string { return names[rng.IntN(len(names))] }
	d := &churnDDL{kind: kind}
	switch kind {
	case ddlCreate, ddlCreateINENew, ddlReplaceMissing:
		if len(live) >= 4 || len(free) == 0 {
			return nil
		}
		d.op, d.name, d.tables = "create", pick(free), pickTables(rng, 1, 3, nil)
		d.ifNotExists = kind == ddlCreateINENew
		if kind == ddlReplaceMissing {
			d.op = "replace"
		}
	case ddlCreateINEExist, ddlCreateExisting:
		if len(live) == 0 {
			return nil
		}
		d.op, d.name, d.tables = "create", pick(live), pickTables(rng, 1, 3, nil)
		d.ifNotExists = kind == ddlCreateINEExist
	case ddlCreateUsedID:
		// The id of a flow created before the load: its coverage window
		// is final within the first cycles, so the id is taken for good
		// whether the flow is live (its info exists) or dropped (its
		// backup catalog stays). A dropped one is preferred.
		id := m.flows[0].id
		if f := m.flows[1]; !f.live() && m.flows[0].live() {
			id = f.id
		}
		if len(free) == 0 || step < 4 {
			return nil
		}
		d.op, d.name, d.tables, d.flowID = "create", pick(free), pickTables(rng, 1, 2, nil), id
	case ddlReplaceAdd, ddlReplaceRemove, ddlReplaceSwap:
		var fit []string
		for _, n := range live {
			k := len(m.live[n].tables)
			if kind == ddlReplaceAdd && k < len(churnTables) || kind == ddlReplaceRemove && k >= 2 ||
				kind == ddlReplaceSwap && k < len(churnTables) {
				fit = append(fit, n)
			}
		}
		if len(fit) == 0 {
			return nil
		}
		d.op, d.name = "replace", pick(fit)
		cur := m.live[d.name].tables
		next := slices.Clone(cur)
		if kind != ddlReplaceAdd { // remove one or two, keep at least one
			rng.Shuffle(len(next), func(i, j int) { next[i], next[j] = next[j], next[i] })
			next = next[:max(1, len(next)-1-rng.IntN(2))]
		}
		if kind != ddlReplaceRemove {
			next = append(next, pickTables(rng, 1, 2, cur)...)
		}
		slices.Sort(next)
		d.tables = slices.Compact(next)
	case ddlDrop:
		if len(live) <= 1 {
			return nil
		}
		d.op, d.name = "drop", pick(live)
	case ddlDropMissing, ddlResumeMissing:
		if len(free) == 0 {
			return nil
		}
		d.op, d.name = "drop", pick(free)
		if kind == ddlResumeMissing {
			d.op = "resume"
		}
	case ddlRecreateSame, ddlRecreateOther:
		if len(dropped) == 0 || len(live) >= 4 {
			return nil
		}
		d.op, d.name = "create", pick(dropped)
		old := m.dropped[d.name].tables
		d.tables = slices.Clone(old)
		if kind == ddlRecreateOther {
			for slices.Equal(d.tables, old) {
				d.tables = pickTables(rng, 1, 3, nil)
			}
		}
	case ddlResume:
		if len(live) == 0 {
			return nil
		}
		d.op, d.name = "resume", pick(live)
	default:
		return nil
	}
	return d
}

// pickTables picks between lo and hi distinct tables not in except, sorted.
func pickTables(rng *rand.Rand, lo, hi int, except []int64) []int64 {
	var pool []int64
	for _, t := range churnTables {
		if !slices.Contains(except, t) {
			pool = append(pool, t)
		}
	}
	rng.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	n := min(lo+rng.IntN(hi-lo+1), len(pool))
	out := slices.Clone(pool[:n])
	slices.Sort(out)
	return out
}

func sortedKeys(m map[string]*churnFlow) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestChurnScript checks the script generator without services: the same
// seed gives the same script, every kind occurs, and the model's ids count
// up by one per created flow.
func TestChurnScript(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		a, m := churnScript(rand.New(rand.NewPCG(seed, 1)), churnSteps)
		b, _ := churnScript(rand.New(rand.NewPCG(seed, 1)), churnSteps)
		kinds := map[string]bool{}
		next := uint32(1)
		for i, d := range a {
			if d.String() != b[i].String() {
				t.Fatalf("seed %d: step %d is %s and %s", seed, i, d, b[i])
			}
			kinds[d.kind] = true
			if d.newID != 0 {
				if d.newID != next {
					t.Fatalf("seed %d: %s, want flow id %d", seed, d, next)
				}
				next++
			}
		}
		for _, k := range ddlKinds {
			if !kinds[k] {
				t.Errorf("seed %d: no step of kind %q", seed, k)
			}
		}
		if int(next-1) != len(m.flows) {
			t.Errorf("seed %d: %d ids handed out, model has %d flows", seed, next-1, len(m.flows))
		}
	}
}
