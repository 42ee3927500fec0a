// Package loadgen generates a deterministic, TiKV-shaped load of apply
// events: the change stream that `producer load` publishes and that the
// end-to-end tests restore and compare against.
//
// # Model
//
// The store has Regions regions (ids 1..Regions). Region r owns the rows
// (table, handle) with handle % Regions == r-1 in every table, so no two
// regions ever write the same key. Each region has its own TSO clock that
// only moves forward. A transaction mutates one row: it takes start_ts and
// then commit_ts from its region's clock (start_ts < commit_ts) and is
// written as TiKV writes it: a write-CF put at commit_ts whose write record
// holds start_ts and, for values up to 255 bytes, the value itself; larger
// values also get a default-CF put at start_ts. A delete is a write-CF put of
// a 'D' record. A small, seeded share of transactions also carries lock-CF
// events (prewrite lock put, commit lock delete) and a small share is rolled
// back, leaving only an 'R' write record at start_ts that restore must skip.
//
// A region sends its transactions in commit-ts order in batches of about
// BatchSize events; each batch's resolved ts is the largest commit ts the
// region has sent, so every transaction at or below it is complete. Optional
// heartbeats (empty batches) advance a region's resolved ts past its last
// commit, and the load always ends with one heartbeat per region, all at the
// same resolved ts, MaxResolvedTS.
//
// Everything is a function of Config: the same Config gives the same bytes.
// Mutations computes the committed row mutations from the same seeded plan
// without going through the event encoders, so tests can use it, with
// Expected, as an independent oracle of what a restore must return.
package loadgen

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultStartTime is the TSO physical base used when Config.StartTime is
// zero.
var DefaultStartTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Marker starts every generated value, so tests can grep logs for leaked
// payload bytes.
const Marker = "flowlog-payload-"

// minValueSize is the smallest value: the marker plus a row tag.
const minValueSize = 32

// Config describes a load. The zero value of each field but Events means its
// default (see RegisterFlags).
type Config struct {
	Events         int       // transactions (row mutations and rollbacks) to generate
	Tables         []int64   // table ids to write; default 1
	Regions        int       // regions, ids 1..Regions; default 4
	Rows           int       // distinct handles per table across all regions; default max(Events/2, Regions)
	ValueSize      int       // bytes per value, at least 32; default 64
	Seed           int64     // RNG seed
	DeleteRatio    float64   // share of deletes among mutations; default 0.1 (negative: none)
	BatchSize      int       // events per ApplyBatch; default 64
	StartTime      time.Time // TSO physical base; zero: DefaultStartTime
	HeartbeatEvery int       // a heartbeat after every N data batches of a region; 0: only the final ones
}

// RegisterFlags registers the load's flags on f.
func (c *Config) RegisterFlags(f *flag.FlagSet) {
	f.IntVar(&c.Events, "events", 10000, "transactions to generate")
	f.Var((*tableList)(&c.Tables), "tables", "table ids to write, comma separated (default 1)")
	f.IntVar(&c.Regions, "regions", 4, "regions (ids 1..N), each with its own keys and TSO clock")
	f.IntVar(&c.Rows, "rows", 0, "distinct rows per table (0: max(events/2, regions))")
	f.IntVar(&c.ValueSize, "value-size", 64, "bytes per value (at least 32; above 255 values go to the default CF)")
	f.Int64Var(&c.Seed, "seed", 1, "seed: the same seed and flags give the same data")
	f.Float64Var(&c.DeleteRatio, "delete-ratio", 0.1, "share of deletes among mutations")
	f.IntVar(&c.BatchSize, "batch-size", 64, "events per ApplyBatch record")
	f.IntVar(&c.HeartbeatEvery, "heartbeat-every", 0, "a heartbeat after every N batches of a region (0: only at the end)")
	f.Func("start-time", "TSO physical base, RFC 3339 (default: now less the load's estimated TSO span, so that it ends about now)", func(s string) error {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return err
		}
		c.StartTime = t
		return nil
	})
}

// Validate reports every problem with c.
func (c *Config) Validate() error {
	var errs []error
	if c.Events < 0 {
		errs = append(errs, fmt.Errorf("events %d: must not be negative", c.Events))
	}
	if c.Regions < 0 || c.Rows < 0 || c.BatchSize < 0 || c.HeartbeatEvery < 0 {
		errs = append(errs, errors.New("regions, rows, batch size and heartbeat-every must not be negative"))
	}
	if c.ValueSize != 0 && c.ValueSize < minValueSize {
		errs = append(errs, fmt.Errorf("value size %d: must be at least %d", c.ValueSize, minValueSize))
	}
	if c.DeleteRatio > 1 {
		errs = append(errs, fmt.Errorf("delete ratio %v: must be at most 1", c.DeleteRatio))
	}
	for _, t := range c.Tables {
		if t <= 0 {
			errs = append(errs, fmt.Errorf("table id %d: must be positive", t))
		}
	}
	return errors.Join(errs...)
}

// Span estimates, from above, how far the load's TSO clocks move past
// StartTime: each region's clock advances about 0.26 ms per transaction of
// the region (measured), so 0.3 ms per transaction per region plus a
// second. A producer that starts the load Span before now ends it about
// now, instead of publishing ts that run ahead of the clock (a consumer
// refuses ts more than its --max-clock-skew ahead).
func (c Config) Span() time.Duration {
	c = c.withDefaults()
	return time.Duration(float64(c.Events)/float64(c.Regions)*0.3*float64(time.Millisecond)) + time.Second
}

// withDefaults returns c with defaults filled in.
func (c Config) withDefaults() Config {
	if len(c.Tables) == 0 {
		c.Tables = []int64{1}
	}
	if c.Regions == 0 {
		c.Regions = 4
	}
	if c.Rows == 0 {
		c.Rows = max(c.Events/2, c.Regions)
	}
	c.Rows = max(c.Rows, c.Regions)
	if c.ValueSize == 0 {
		c.ValueSize = 64
	}
	if c.DeleteRatio == 0 {
		c.DeleteRatio = 0.1
	}
	if c.BatchSize == 0 {
		c.BatchSize = 64
	}
	if c.StartTime.IsZero() {
		c.StartTime = DefaultStartTime
	}
	return c
}

// tableList is a flag.Value of comma-separated table ids.
type tableList []int64

func (l *tableList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, t := range *l {
		s[i] = strconv.FormatInt(t, 10)
	}
	return strings.Join(s, ",")
}

func (l *tableList) Set(v string) error {
	var out []int64
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return fmt.Errorf("table id %q: %w", f, err)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}
