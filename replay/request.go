package replay

import (
	"fmt"
	"time"

	"github.com/flowlog/flowlog/backup"
)

// Mode is what a replay republishes.
type Mode string

// The modes.
const (
	// ModeLog republishes the backed-up events of (From, To].
	ModeLog Mode = "log"
	// ModeState publishes the MVCC state at To.
	ModeState Mode = "state"
)

// Format is the form of the ApplyBatch records written.
type Format string

// The formats (docs/FORMAT.md, "ApplyBatch records").
const (
	FormatProtobuf Format = "protobuf"
	FormatJSON     Format = "json"
)

// Request is one replay: what to read, and how to write it.
type Request struct {
	// Flow names the flow; MaxClockSkew and Notify are as in
	// backup.Request.
	Flow         backup.Lookup
	MaxClockSkew time.Duration
	Notify       func(backup.Event)
	// Selection is what is replayed: the tables (nil Tables: all) and the
	// raw key range, as restore applies them (backup.Selection). It must
	// pass Validate.
	Selection backup.Selection
	Mode      Mode
	// From is the ts after which log events are replayed (0: from the
	// start of the backup); To is the ts replayed up to (0: the flow's
	// checkpoint, which it may not exceed).
	From, To uint64
	Format   Format
	// Topic is the target topic, only part of the run id: the target
	// writes to it.
	Topic string
	// Rate bounds the bytes per second written (0: unbounded).
	Rate int64
	// MaxMemory bounds the chunk bytes held at once (default 128 MiB);
	// Parallel is the number of chunks read at once (default 4).
	MaxMemory int64
	Parallel  int
	// TempDir holds a state replay's sorted runs (default os.TempDir()).
	TempDir string
	// Progress, if set, is called after every chunk.
	Progress func(Progress)
	// Clock is the rate limiter's clock (nil: the system's).
	Clock Clock
}

// Progress is how far a replay is.
type Progress struct {
	Chunks, ChunksTotal int
	Records             int64 // records produced or skipped
	Bytes               int64 // bytes of the records produced
	Skipped             int64 // records a previous run already wrote
}

// Result is what a replay read and wrote.
type Result struct {
	Flow     backup.Flow
	Mode     Mode
	From, To uint64
	// RunID is the run's id (see RunID).
	RunID string
	// Tables are the tables replayed, ascending.
	Tables []int64
	// Records and Bytes count what this run produced; Skipped the records
	// an earlier run with the same arguments had written already.
	Records, Bytes, Skipped int64
	// Regions is the number of regions the records went to.
	Regions int
	// Chunks and LogBytes are the log chunks read and their uncompressed
	// bytes.
	Chunks   int
	LogBytes int64
}

func (r *Request) defaults() {
	if r.Mode == "" {
		r.Mode = ModeLog
	}
	if r.Format == "" {
		r.Format = FormatProtobuf
	}
	if r.MaxMemory <= 0 {
		r.MaxMemory = 128 << 20
	}
	if r.Parallel <= 0 {
		r.Parallel = 4
	}
	if r.Clock == nil {
		r.Clock = systemClock{}
	}
}

// Validate reports a request that cannot run.
func (r *Request) Validate() error {
	switch r.Mode {
	case "", ModeLog, ModeState:
	default:
		return fmt.Errorf("mode %q: want log or state", r.Mode)
	}
	switch r.Format {
	case "", FormatProtobuf, FormatJSON:
	default:
		return fmt.Errorf("format %q: want protobuf or json", r.Format)
	}
	if r.Mode == ModeState && r.From != 0 {
		return fmt.Errorf("from applies to log mode only: state mode publishes the state at to")
	}
	if r.To != 0 && r.From >= r.To {
		return fmt.Errorf("from %d is not before to %d", r.From, r.To)
	}
	if err := r.Selection.Validate(); err != nil {
		return err
	}
	if r.Rate < 0 {
		return fmt.Errorf("rate %d: must not be negative", r.Rate)
	}
	return nil
}
