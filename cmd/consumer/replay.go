package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/replay"
)

// replayConfig is everything `consumer replay` takes.
type replayConfig struct {
	conn       connConfig
	Flow       string
	FlowID     uint
	ToTopic    string
	ToBrokers  string
	Select     backup.SelectionFlags
	Mode       string
	From       fromFlag
	To         tsFlag
	Rate       cli.Size
	Format     string
	FromBucket bool
	MaxMemory  cli.Size
	MaxMessage cli.Size
	Compress   string
	Parallel   int
	TempDir    string
	metrics    opMetrics
	out        output
}

func (c *replayConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.uses = useBrokers
	c.conn.RegisterFlags(f)
	addFlowFlags(f, &c.Flow, &c.FlowID)
	f.StringVar(&c.ToTopic, "to-topic", "", "topic to write the ApplyBatch records to (required; it must exist)")
	f.StringVar(&c.ToBrokers, "to-brokers", "", "brokers of --to-topic, comma separated (default: --brokers)")
	c.Select.RegisterFlags(f)
	f.StringVar(&c.Mode, "mode", "log", "log: the backed-up events of (--from, --to]; state: the MVCC state at --to")
	f.Var(&c.From, "from", "log mode: replay the events after this TSO, RFC 3339 time or negative duration ago (default 0: from the start of the backup)")
	f.Var(&c.To, "to", "replay up to this TSO, RFC 3339 time or negative duration ago (default: the flow's checkpoint; may not exceed it)")
	f.Var(&c.Rate, "rate", "bytes per second to write at most, e.g. 50MiB (default 0: unbounded)")
	f.StringVar(&c.Format, "format", "protobuf", "record value form: protobuf, or json (with header content-type: application/json)")
	f.BoolVar(&c.FromBucket, "from-bucket", false, "read the backup from the bucket alone, without Redis (as restore --from-bucket)")
	c.MaxMemory = 128 << 20
	f.Var(&c.MaxMemory, "max-memory", "chunk bytes and queued records held at once; also the Go soft memory limit unless GOMEMLIMIT is set")
	f.Var(&c.MaxMessage, "max-message-bytes", "largest record batch --to-topic takes (default 0: the topic's max.message.bytes, as its brokers describe it)")
	f.StringVar(&c.Compress, "compression", "snappy", "record batch compression: none, gzip, snappy, lz4 or zstd")
	f.IntVar(&c.Parallel, "parallel", 4, "chunks read at once")
	f.StringVar(&c.TempDir, "temp-dir", os.TempDir(), "directory for sorted runs while reading the state (--mode state)")
	c.metrics.RegisterFlags(f)
	c.out.RegisterFlags(f)
}

// fromFlag is --from: 0, or any form --ts takes.
type fromFlag struct{ tsFlag }

func (f *fromFlag) Set(s string) error {
	if s == "0" {
		f.tsFlag = tsFlag{arg: s}
		return nil
	}
	return f.tsFlag.Set(s)
}

func (c *replayConfig) check() error {
	switch {
	case c.ToTopic == "":
		return errors.New("--to-topic is required")
	case c.Mode != string(replay.ModeLog) && c.Mode != string(replay.ModeState):
		return fmt.Errorf("--mode %q: want log or state", c.Mode)
	case c.Format != string(replay.FormatProtobuf) && c.Format != string(replay.FormatJSON):
		return fmt.Errorf("--format %q: want protobuf or json", c.Format)
	case c.Mode == string(replay.ModeState) && c.From.ts != 0:
		return errors.New("--from applies to --mode log only: --mode state publishes the state at --to")
	case c.Parallel < 1:
		return errors.New("--parallel: must be at least 1")
	case !replay.KnownCompression(c.Compress):
		return fmt.Errorf("--compression %q: want none, gzip, snappy, lz4 or zstd", c.Compress)
	case c.MaxMessage != 0 && (c.MaxMessage < 512 || c.MaxMessage > 1<<30):
		return fmt.Errorf("--max-message-bytes %d: want 512 bytes to 1 GiB", int64(c.MaxMessage))
	case c.To.ts != 0 && c.From.ts >= c.To.ts:
		return fmt.Errorf("--from %d is not before --to %d", c.From.ts, c.To.ts)
	}
	if err := c.Select.Validate(); err != nil {
		return err
	}
	_, err := flowLookup(c.Flow, c.FlowID)
	return err
}

func runReplay(ctx context.Context, args []string) error {
	fs := newFlagSet("replay")
	var cfg replayConfig
	cfg.RegisterFlags(fs)
	if err := cfg.conn.parse(fs, args, cfg.check); err != nil {
		return err
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(int64(cfg.MaxMemory))
	}
	stopProfile, err := startCPUProfile(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	defer stopProfile()
	b, st, closeBackup, err := cfg.conn.openBackup(ctx, cfg.FromBucket, cfg.Parallel)
	if err != nil {
		return err
	}
	defer closeBackup()
	kc := cfg.conn.Kafka
	if cfg.ToBrokers != "" {
		kc.Brokers = cfg.ToBrokers
	}
	opts, err := kc.Opts()
	if err != nil {
		return err
	}
	t, err := replay.NewKafkaTarget(ctx, replay.KafkaTargetConfig{Topic: cfg.ToTopic, MaxBuffered: replay.ProducerMemory(int64(cfg.MaxMemory)),
		MaxMessageBytes: int32(cfg.MaxMessage), Compression: cfg.Compress}, opts...)
	if err != nil {
		return err
	}
	defer t.Close()
	cfg.metrics.register("replay")
	start := time.Now()
	err = runReplayWith(ctx, &cfg, cfg.conn.source(st, b), t)
	if merr := cfg.metrics.finish(start, err); merr != nil && err == nil {
		return merr
	}
	return err
}

// replayJSON is `consumer replay --json` (docs/SCRIPTING.md, "JSON
// output").
type replayJSON struct {
	Flow    flowJSON `json:"flow"`
	Mode    string   `json:"mode"`
	From    tsJSON   `json:"from"`
	To      tsJSON   `json:"to"`
	Topic   string   `json:"topic"`
	RunID   string   `json:"run_id"`
	Records int64    `json:"records"`
	Bytes   int64    `json:"bytes"`
	Skipped int64    `json:"skipped"`
	Resumed bool     `json:"resumed"`
	Regions int      `json:"regions"`
	Chunks  int      `json:"chunks"`
	// LogBytes are the chunks' uncompressed bytes read.
	LogBytes int64     `json:"log_bytes"`
	Tables   []int64   `json:"tables"`
	LeftOut  []leftOut `json:"left_out"`
	Seconds  float64   `json:"seconds"`
	// Selection is what was asked for, as restore's.
	Selection selJSON `json:"selection"`
}

// runReplayWith runs a parsed `consumer replay` into t: replay.Run decides
// what it writes, this prints it and counts it in the metrics.
func runReplayWith(ctx context.Context, cfg *replayConfig, src backup.Source, t replay.Target) error {
	sel, _ := cfg.Select.Selection()
	l, _ := flowLookup(cfg.Flow, cfg.FlowID)
	r := &reader{ts: &cfg.To, verb: "replaying", noun: "replay", tables: cfg.Select.Tables, out: &cfg.out}
	progress := newProgressLine(os.Stderr)
	start := time.Now()
	var last replay.Progress
	notify := func(e backup.Event) {
		if _, ok := e.(backup.TSChosen); !ok {
			r.notify(e)
			return
		}
		for _, f := range []struct {
			name string
			ts   *tsFlag
		}{{"--from", &cfg.From.tsFlag}, {"--to", &cfg.To}} {
			if f.ts.form != "" {
				cfg.out.printf("%s %s\n", f.name, f.ts.describe())
			}
		}
	}
	res, err := replay.Run(ctx, src, t, replay.Request{
		Flow: l, MaxClockSkew: cfg.conn.MaxClockSkew, Notify: notify, Selection: sel,
		Mode: replay.Mode(cfg.Mode), From: cfg.From.ts, To: cfg.To.ts, Format: replay.Format(cfg.Format), Topic: cfg.ToTopic,
		Rate: int64(cfg.Rate), MaxMemory: int64(cfg.MaxMemory), Parallel: cfg.Parallel, TempDir: cfg.TempDir,
		Progress: func(p replay.Progress) {
			last = p
			progress.show("replayed %d/%d chunks: %d records (%.1f MiB), %d skipped as written before", p.Chunks, p.ChunksTotal, p.Records, float64(p.Bytes)/(1<<20), p.Skipped)
		},
	})
	progress.done()
	secs := time.Since(start).Seconds()
	f := res.Flow
	if res.Flow.Name != "" {
		name := f.String()
		cfg.metrics.records.WithLabelValues(name).Set(float64(res.Records))
		cfg.metrics.bytes.WithLabelValues(name).Set(float64(res.Bytes))
	}
	var (
		re *replay.RangeError
		te *backup.TruncatedError
	)
	switch {
	case err != nil && cli.Interrupted(ctx):
		// A relative or omitted bound resolves anew on the re-run, which
		// would make it another run: name the TSOs this one used.
		var pin []string
		if cfg.From.form != "" {
			pin = append(pin, fmt.Sprintf("--from %d", res.From))
		}
		if (cfg.To.form != "" || cfg.To.ts == 0) && res.To != 0 {
			pin = append(pin, fmt.Sprintf("--to %d", res.To))
		}
		resume := ""
		if len(pin) > 0 {
			resume = " with " + strings.Join(pin, " ")
		}
		return cli.Interruptedf("replay of flow %s (id %d) into %s, %s mode (%d, %d], stopped after %d of %d chunks: %d records written, %d skipped; records queued but unconfirmed may or may not be in the topic; re-run the same command%s to resume (it skips what is written)",
			f, f.ID, cfg.ToTopic, res.Mode, res.From, res.To, last.Chunks, last.ChunksTotal, res.Records, res.Skipped, resume)
	case errors.As(err, &re):
		return err
	case errors.As(err, &te) && res.Mode == replay.ModeLog && te.TS == res.From && te.Table < 0:
		return fmt.Errorf("--from %d (%s) is before the truncation point of flow %s (id %d): the log before %d (%s) was removed; "+
			"replay --mode state --to %d and then --mode log --from %d, or pass a --from at or after it",
			te.TS, tsTime(te.TS), f, f.ID, te.TruncatedBefore, tsTime(te.TruncatedBefore), te.TruncatedBefore, te.TruncatedBefore)
	case err != nil:
		return r.explain(err)
	}
	mb := float64(res.Bytes) / (1 << 20)
	cfg.out.printf("replayed flow %s/%s (id %d), %s mode, (%d (%s), %d (%s)] into %s: run %s\n", f.Catalog, f.Name, f.ID, res.Mode,
		res.From, tsTime(res.From), res.To, tsTime(res.To), cfg.ToTopic, res.RunID)
	cfg.out.printf("%d records, %.1f MiB, %d regions, %d tables, %d chunks in %.2fs (%.1f MiB/s)\n", res.Records, mb, res.Regions, len(res.Tables), res.Chunks, secs, mb/max(secs, 1e-9))
	if res.Skipped > 0 {
		cfg.out.printf("resumed: %d records an earlier run with the same arguments had written were skipped\n", res.Skipped)
	}
	return cfg.out.result(replayJSON{Flow: flowOf(f), Mode: string(res.Mode), From: tsOf(res.From), To: tsOf(res.To), Topic: cfg.ToTopic, RunID: res.RunID,
		Records: res.Records, Bytes: res.Bytes, Skipped: res.Skipped, Resumed: res.Skipped > 0, Regions: res.Regions, Chunks: res.Chunks, LogBytes: res.LogBytes,
		Tables: nonNil(res.Tables), LeftOut: nonNil(r.leftOut), Seconds: secs, Selection: selectionOf(sel)})
}
