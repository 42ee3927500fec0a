package pipeline

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// Config is the pipeline's part of `consumer run`.
type Config struct {
	TempDir       string
	FlushSize     cli.Size
	FlushInterval time.Duration
	MaxTempBytes  cli.Size
	MaxValueSize  cli.Size
	// MaxBatchBytes is the most a fetched record batch may decompress to;
	// a batch past it goes to the DLQ whole (bigbatch.go).
	MaxBatchBytes cli.Size
	// MaxTablesPerFlow is the most source tables a flow's create or
	// replace may name; a larger one goes to the DLQ (ddl_rejected).
	MaxTablesPerFlow int
	RegionTTL        time.Duration
	StartOffset      string // earliest | latest
	StoreID          string
	Compression      string // none | zstd
	UploadParallel   int
	FatalAfter       int // consecutive failed cycles that make a flow fatal
	RetryBackoff     time.Duration
	MaxRetryDelay    time.Duration
	// ShutdownTimeout bounds the final flush on SIGTERM.
	ShutdownTimeout time.Duration
	// MaxCommitAge is the age past which a cycle's uploaded objects are
	// uploaded again under new names before its commit, so that consumer
	// gc (whose --grace must exceed it) never deletes a committed object;
	// 0 turns it off (commitage.go).
	MaxCommitAge time.Duration
	// SessionTimeout is the consumer group session timeout, also used as the
	// rebalance timeout: how long the group waits for a silent member (a
	// crashed or frozen process) before moving its partitions. Zero keeps
	// the Kafka client's defaults.
	SessionTimeout time.Duration
	// StallTimeout is how long the consume loop may go without handling a
	// record while records wait before /readyz reports it stalled.
	StallTimeout time.Duration
	// AdminToken is the bearer token POST /flush requires; AdminTokenFile
	// names a file holding it instead. With neither, /flush is only served
	// to loopback clients.
	AdminToken     string
	AdminTokenFile string
	// MaxOpenFiles caps the write buffers of temp files at MaxOpenFiles
	// full-size (32 KiB) buffers' bytes at once (the files share one
	// segment file per generation, segment.go); New lowers it to half the
	// soft RLIMIT_NOFILE. Zero means 1024.
	MaxOpenFiles int
	// MaxCycleFiles freezes a cycle when its generation has this many temp
	// files; fetching pauses while current and in-flight cycles hold more
	// than twice as many. Zero means 10000.
	MaxCycleFiles int
	// MaxMemory is the memory the consumer plans for: the Go soft memory
	// limit (unless GOMEMLIMIT is set; cmd/consumer applies it) and the
	// source of the Kafka fetch bounds, the open temp file cap, the cycle
	// file cap and the GCS upload chunk (memoryPlan). Zero means 128 MiB.
	MaxMemory cli.Size
	// MaxClockSkew bounds how far ahead of the consumer's clock a record's
	// resolved ts or event ts may lie; a record past it goes to the DLQ
	// (reason ts_future) and counts toward nothing, and no checkpoint
	// passes the clock plus it. The command registers the flag
	// (--max-clock-skew, shared with the operator commands, which refuse a
	// restore ts past it). Zero means DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// Layout is the bucket layout new cycles are written in: LayoutV1 (a
	// data object, a meta and a checkpoint object per flow per cycle) or
	// LayoutV2 (one data object and one meta per cycle for every flow, one
	// global checkpoint object, per-flow catalogs; docs/FORMAT.md, "Layout
	// v2"). The --layout flag defaults to LayoutV2; an empty Layout, as a
	// Config built in code without it, means LayoutV1.
	Layout string
}

// Bucket layouts of --layout.
const (
	LayoutV1 = "v1"
	LayoutV2 = "v2"
)

// v2 reports whether cycles are written in layout v2.
func (c *Config) v2() bool { return c.Layout == LayoutV2 }

// DefaultMaxClockSkew is --max-clock-skew's default: far more than NTP-synced
// clocks disagree, far less than a heartbeat that claims the year 4199.
const DefaultMaxClockSkew = 5 * time.Minute

// RegisterFlags registers the pipeline flags on f.
func (c *Config) RegisterFlags(f *flag.FlagSet) {
	host := defaultStoreID()
	c.FlushSize = 128 << 20
	c.MaxTempBytes = 4 << 30
	c.MaxValueSize = 8 << 20
	c.MaxBatchBytes = defaultMaxBatchBytes
	c.MaxMemory = defaultMaxMemory
	f.StringVar(&c.TempDir, "temp-dir", "./flowlog-temp", "directory of its own for per-table temp files (leftovers are removed at start; a non-empty directory flowlog did not mark is refused)")
	f.Var(&c.FlushSize, "flush-size", "start a flush cycle when temp files reach this size (bytes, or B/KiB/MiB/GiB)")
	f.DurationVar(&c.FlushInterval, "flush-interval", time.Minute, "start a flush cycle when 0.8x this has passed since the last one")
	f.Var(&c.MaxTempBytes, "max-temp-bytes", "pause fetching while temp files (current and in flight) exceed this size")
	f.IntVar(&c.MaxOpenFiles, "max-open-files", defaultMaxOpenFiles, "write buffers (4-32KiB each) of temp files, in 32KiB buffers: at most this x 32KiB at once (past it a full buffer goes to disk as it is, and files write what they hold and give their buffer back as needed); at most half the open file limit (ulimit -n)")
	f.IntVar(&c.MaxCycleFiles, "max-cycle-files", defaultMaxCycleFiles, "start a flush cycle when the current one has this many temp files; fetching pauses while current and in-flight cycles hold more than twice as many")
	f.Var(&c.MaxMemory, "max-memory", "memory to plan for, code included: the Go soft memory limit is this less 32MiB (at least half of it) unless GOMEMLIMIT is set; Kafka fetches and GCS upload chunks get a quarter each, temp file buffers a tenth and temp file bookkeeping a sixth (--max-open-files and --max-cycle-files are lowered to fit)")
	f.Var(&c.MaxValueSize, "max-value-size", "apply records, and events of them, with a key or value larger than this go to the DLQ (sizes after decompression)")
	f.IntVar(&c.MaxTablesPerFlow, "max-tables-per-flow", meta.DefaultMaxTablesPerFlow,
		"a flow create or replace naming more source tables than this goes to the DLQ (ddl_rejected)")
	f.Var(&c.MaxBatchBytes, "max-batch-bytes", "a fetched record batch that decompresses to more than this, or does not decompress, goes to the DLQ whole; at least --max-value-size + 64KiB")
	f.DurationVar(&c.RegionTTL, "region-ttl", 10*time.Minute, "a region silent this long no longer holds its partition's checkpoint back")
	f.StringVar(&c.StartOffset, "start-offset", "earliest", "where a partition with no committed offset starts: earliest or latest")
	f.StringVar(&c.StoreID, "store-id", host, "identifies this instance in object metadata and cycle ids")
	f.StringVar(&c.Compression, "compression", "zstd", "chunk compression in data objects: none or zstd")
	f.IntVar(&c.UploadParallel, "upload-parallelism", 4, "flows uploaded at once in a flush cycle")
	f.IntVar(&c.FatalAfter, "fatal-after", 30, "consecutive failed flush cycles that make a flow fatal")
	f.DurationVar(&c.RetryBackoff, "retry-backoff", 500*time.Millisecond, "first delay before retrying a failed flush cycle (doubles, jittered)")
	f.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", time.Minute, "how long a graceful stop waits for the final flush before giving up (nothing is lost: uncommitted data is consumed again)")
	f.DurationVar(&c.MaxRetryDelay, "max-retry-delay", 30*time.Second, "largest delay between retries of a failed flush cycle")
	f.DurationVar(&c.MaxCommitAge, "max-commit-age", 15*time.Minute,
		"a cycle whose objects were uploaded longer ago than this uploads them again under new names before it commits; keep consumer gc's --grace above it (0: off)")
	f.DurationVar(&c.SessionTimeout, "session-timeout", 45*time.Second, "consumer group session and rebalance timeout: how long a silent member keeps its partitions")
	f.DurationVar(&c.StallTimeout, "stall-timeout", 2*time.Minute, "/readyz fails when no record was handled for this long while records wait (a stuck DLQ, a fatal flow)")
	f.StringVar(&c.AdminToken, "admin-token", "", "bearer token POST /flush requires (better set FLOWLOG_ADMIN_TOKEN or --admin-token-file: flags show in ps); empty: /flush only from loopback")
	f.StringVar(&c.Layout, "layout", LayoutV2, "bucket layout of new backups: v2 (one data object and meta per cycle for every flow, restorable and recoverable from the bucket alone) or v1 (objects per flow per cycle, the layout of earlier versions); a v1 backup continues under v2 without a rewrite")
	f.StringVar(&c.AdminTokenFile, "admin-token-file", "", "file holding the bearer token POST /flush requires (surrounding whitespace ignored)")
}

// Validate reports every problem with c.
func (c *Config) Validate() error {
	var errs []error
	if c.TempDir == "" {
		errs = append(errs, errors.New("--temp-dir: must not be empty"))
	}
	if c.FlushSize <= 0 {
		errs = append(errs, errors.New("--flush-size: must be positive"))
	}
	if c.FlushInterval <= 0 {
		errs = append(errs, errors.New("--flush-interval: must be positive"))
	}
	if c.MaxTempBytes < c.FlushSize {
		errs = append(errs, fmt.Errorf("--max-temp-bytes (%d) must be at least --flush-size (%d)", c.MaxTempBytes, c.FlushSize))
	}
	if c.MaxOpenFiles < 0 {
		errs = append(errs, errors.New("--max-open-files: must not be negative (0: the default)"))
	}
	if c.MaxCycleFiles < 0 {
		errs = append(errs, errors.New("--max-cycle-files: must not be negative (0: the default)"))
	}
	if c.MaxMemory < 0 || c.MaxMemory > 0 && c.MaxMemory < minMaxMemory {
		errs = append(errs, fmt.Errorf("--max-memory: %d bytes is below the minimum of 16MiB", int64(c.MaxMemory)))
	}
	if c.MaxValueSize <= 0 {
		errs = append(errs, errors.New("--max-value-size: must be positive"))
	}
	if c.MaxBatchBytes != 0 && c.MaxBatchBytes < c.MaxValueSize+minBatchOverValue {
		errs = append(errs, fmt.Errorf("--max-batch-bytes (%d) must be at least --max-value-size + 64KiB (%d): a batch must hold one record of the largest size",
			int64(c.MaxBatchBytes), int64(c.MaxValueSize+minBatchOverValue)))
	}
	if c.MaxClockSkew < 0 {
		errs = append(errs, errors.New("--max-clock-skew: must not be negative (0: the default)"))
	}
	if c.MaxTablesPerFlow < 0 {
		errs = append(errs, errors.New("--max-tables-per-flow: must not be negative (0: the default)"))
	}
	if c.StallTimeout < 0 {
		errs = append(errs, errors.New("--stall-timeout: must not be negative"))
	}
	if c.RegionTTL <= 0 {
		errs = append(errs, errors.New("--region-ttl: must be positive"))
	}
	if c.StartOffset != "earliest" && c.StartOffset != "latest" {
		errs = append(errs, fmt.Errorf("--start-offset: %q is neither earliest nor latest", c.StartOffset))
	}
	if !validID(c.StoreID) {
		errs = append(errs, fmt.Errorf("--store-id: %q must match [A-Za-z0-9_-]{1,64}", c.StoreID))
	}
	if c.Layout != "" && c.Layout != LayoutV1 && c.Layout != LayoutV2 {
		errs = append(errs, fmt.Errorf("--layout: %q is neither v1 nor v2", c.Layout))
	}
	if c.Compression != "none" && c.Compression != "zstd" {
		errs = append(errs, fmt.Errorf("--compression: %q is neither none nor zstd", c.Compression))
	}
	if c.UploadParallel < 1 {
		errs = append(errs, errors.New("--upload-parallelism: must be at least 1"))
	}
	if c.FatalAfter < 1 {
		errs = append(errs, errors.New("--fatal-after: must be at least 1"))
	}
	if c.RetryBackoff <= 0 || c.MaxRetryDelay < c.RetryBackoff {
		errs = append(errs, errors.New("--retry-backoff must be positive and at most --max-retry-delay"))
	}
	if c.SessionTimeout < 0 {
		errs = append(errs, errors.New("--session-timeout: must not be negative"))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("--shutdown-timeout: must be positive"))
	}
	if c.MaxCommitAge < 0 {
		errs = append(errs, errors.New("--max-commit-age: must not be negative"))
	}
	if c.AdminToken != "" && c.AdminTokenFile != "" {
		errs = append(errs, errors.New("--admin-token and --admin-token-file: set one, not both"))
	} else if _, err := c.adminToken(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// defaultMaxBatchBytes is --max-batch-bytes' default: twice the default
// --max-value-size; a producer's batches are 1 MiB or less uncompressed
// unless it was told otherwise.
const defaultMaxBatchBytes = 16 << 20

// minBatchOverValue is the room a batch needs past --max-value-size for
// its record's key, headers and framing.
const minBatchOverValue = 64 << 10

// batchMax is --max-batch-bytes, or its default when the Config leaves it
// zero.
func (c *Config) batchMax() int {
	if c.MaxBatchBytes <= 0 {
		return max(defaultMaxBatchBytes, int(c.MaxValueSize+minBatchOverValue))
	}
	return int(c.MaxBatchBytes)
}

// adminToken is the token POST /flush requires, "" for none, read from
// --admin-token-file if that is set.
func (c *Config) adminToken() (string, error) {
	if c.AdminTokenFile == "" {
		return c.AdminToken, nil
	}
	b, err := os.ReadFile(c.AdminTokenFile)
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("--admin-token-file %s: empty", c.AdminTokenFile)
	}
	return tok, nil
}

// cycleInterval is the time trigger of a flush cycle: 0.8 x --flush-interval
// after the previous one, so that a cycle, its upload included, usually
// ends within --flush-interval (docs/FORMAT.md, "Flush cycle").
func (c *Config) cycleInterval() time.Duration {
	return c.FlushInterval * 4 / 5
}

// defaultStoreID is the hostname with characters outside [A-Za-z0-9_-]
// replaced by '-', cut to 64 bytes.
func defaultStoreID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "flowlog"
	}
	b := []byte(host)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// validID accepts a store id: a name as sink.ValidName allows, at most 64
// bytes, since it becomes part of every object name.
func validID(s string) bool { return len(s) <= 64 && sink.ValidName(s) }
