package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/flowlog/flowlog/internal/buildinfo"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// runConfig is everything `consumer run` takes.
type runConfig struct {
	conn       connConfig
	pipe       pipeline.Config
	LogFormat  string
	RedactLogs bool
}

func (c *runConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.uses = useKafka | useHTTP
	c.conn.RegisterFlags(f)
	c.pipe.RegisterFlags(f)
	f.StringVar(&c.LogFormat, "log-format", "auto", "log format: json, text, or auto (text when stderr is a terminal, json otherwise)")
	f.BoolVar(&c.RedactLogs, "redact-logs", true, "keep record keys and values out of logs")
}

// minFlushSize is the smallest --flush-size: below it every few records
// would make a flush cycle of their own (pipeline.Config only requires a
// positive size).
const minFlushSize = 64 << 10

// Validate reports every problem, one per line.
func (c *runConfig) Validate() error {
	var errs []error
	c.pipe.MaxClockSkew = c.conn.MaxClockSkew
	errs = append(errs, c.conn.Validate(), c.pipe.Validate())
	if c.pipe.FlushSize > 0 && c.pipe.FlushSize < minFlushSize {
		errs = append(errs, fmt.Errorf("--flush-size: %d bytes is below the minimum of 64KiB", int64(c.pipe.FlushSize)))
	}
	switch c.LogFormat {
	case "auto", "json", "text":
	default:
		errs = append(errs, fmt.Errorf("--log-format: %q is not json, text or auto", c.LogFormat))
	}
	return errors.Join(errs...)
}

func runRun(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("consumer run", intro("run"), "Run", runSections...)
	var cfg runConfig
	cfg.RegisterFlags(fs)
	badValues := cli.Lenient(fs)
	src, err := cli.ParseSources(fs, args)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments %q", fs.Args())
	}
	if err := errors.Join(badValues(), cfg.Validate()); err != nil {
		return invalidConfig(src, err)
	}
	if err := checkGCSCredentials(cfg.conn.GCS); err != nil {
		return err
	}
	log := newLogger(cfg.LogFormat)
	redis.SetLogger(redisLog{log: log})
	applyMemoryLimit(log, cfg.pipe.MemoryBudget())
	stopProfile, err := startCPUProfile(log)
	if err != nil {
		return err
	}
	defer stopProfile()
	ctx, stop := signalContext(ctx, log, cfg.pipe.ShutdownTimeout)
	defer stop()
	if err := checkRedis(ctx, cfg.conn.Redis); err != nil {
		return err
	}
	return serve(ctx, cfg, log, nil)
}

// applyMemoryLimit sets the Go runtime's soft memory limit from
// --max-memory (pipeline.GoMemoryLimit: the budget less what the runtime
// does not count, the binary's code), so that the garbage collector works
// harder rather than let the process pass the budget, unless GOMEMLIMIT is set: the runtime has read that already and it
// stays (an operator's explicit limit for the runtime wins; --max-memory
// still sizes fetches and buffers). `consumer dev` does not call it: its
// process also holds the embedded Kafka and GCS.
func applyMemoryLimit(log *slog.Logger, maxMemory int64) {
	source := "GOMEMLIMIT"
	if os.Getenv("GOMEMLIMIT") == "" {
		source = "--max-memory"
		debug.SetMemoryLimit(pipeline.GoMemoryLimit(maxMemory))
	}
	log.Info("go memory limit", "memory_limit", debug.SetMemoryLimit(-1), "source", source)
}

// checkRedis fails at start, naming Redis's address, if it does not answer.
func checkRedis(ctx context.Context, c meta.Config) error {
	rdb, err := c.NewClient()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer rdb.Close()
	return pingRedis(ctx, rdb, c.URL)
}

// newLogger logs to stderr in format: json, text, or auto, which is text
// on a terminal (a person reading) and JSON otherwise (a log collector).
func newLogger(format string) *slog.Logger {
	if format == "auto" {
		format = "json"
		if isTerminal(os.Stderr) {
			format = "text"
		}
	}
	var h slog.Handler
	if format == "text" {
		h = slog.NewTextHandler(os.Stderr, nil)
	} else {
		h = slog.NewJSONHandler(os.Stderr, nil)
	}
	return slog.New(h)
}

// signalContext is canceled by the first SIGTERM/SIGINT (graceful: finish
// the cycle in flight, flush, commit, leave the group, within
// --shutdown-timeout); a second one exits at once without committing
// anything not yet committed.
func signalContext(parent context.Context, log *slog.Logger, shutdownTimeout time.Duration) (context.Context, func()) {
	return cli.Interrupt(parent, func(sig os.Signal) {
		log.Info("signal received: flushing, committing and leaving the group; signal again to exit at once",
			"signal", sig.String(), "shutdown_timeout", shutdownTimeout.String())
	}, func() {
		log.Warn("second signal: exiting without committing")
	})
}

// serve builds the parts from cfg and runs the consumer until ctx ends.
// onReady, if set, is called once the HTTP listener is up.
func serve(ctx context.Context, cfg runConfig, log *slog.Logger, onReady func(httpAddr string)) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildinfo.Register(reg)

	rdb, err := cfg.conn.Redis.NewClient()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer rdb.Close()
	store := meta.NewStore(rdb, cfg.conn.Redis.Prefix, reg)
	gcsCfg := cfg.conn.GCS
	gcsCfg.ChunkSize = cfg.pipe.UploadChunkSize() // upload buffers within --max-memory
	gb, err := gcs.New(ctx, gcsCfg)
	if err != nil {
		return fmt.Errorf("gcs: %w", err)
	}
	bucket := sink.WithMetrics(gb, reg)
	defer bucket.Close()
	// A prefix of another group is refused first, from Redis alone.
	if err := checkPrefixOwner(ctx, store, cfg.conn); err != nil {
		return err
	}
	// Every cycle lists, creates and deletes objects under the prefix: a
	// bucket that refuses one of them is reported now, in one line, not as
	// the failure of the first upload.
	warn := func(err error) { log.Warn("gcs write probe failed", "err", err) }
	if err := checkBucket(ctx, gb, cfg.conn.GCS, true, warn); err != nil {
		return err
	}
	if err := claimPrefix(ctx, store, bucket, cfg.conn); err != nil {
		return err
	}
	registry := meta.NewRegistry(store)

	kopts, err := cfg.conn.Kafka.Opts()
	if err != nil {
		return err
	}
	kmetrics := kprom.NewMetrics("flowlog", kprom.Registerer(reg), kprom.Gatherer(reg))

	dlqClient, err := kgo.NewClient(append(append([]kgo.Opt{}, kopts...), dlq.ClientOpts(cfg.conn.Kafka.DLQTopic)...)...)
	if err != nil {
		return fmt.Errorf("kafka dlq client: %w", err)
	}
	defer dlqClient.Close()
	dlqw := dlq.New(dlqClient, cfg.conn.Kafka.DLQTopic, reg)

	applier, err := meta.NewApplier(store, registry, meta.ApplierConfig{
		Topic: cfg.conn.Kafka.DDLTopic, KafkaOpts: kopts, DLQ: dlqw, Logger: log, Registerer: reg,
		MaxTablesPerFlow: cfg.pipe.MaxTablesPerFlow,
	})
	if err != nil {
		return fmt.Errorf("ddl applier: %w", err)
	}
	defer applier.Close()

	if err := registry.Refresh(ctx); err != nil {
		return fmt.Errorf("load flows from redis: %w", err)
	}
	cons, err := pipeline.New(cfg.pipe, pipeline.Deps{
		ApplyTopic: cfg.conn.Kafka.ApplyTopic, Group: cfg.conn.Group, KafkaOpts: kopts,
		GroupOpts: []kgo.Opt{kgo.WithHooks(kmetrics)},
		Store:     store, Registry: registry, Applier: applier, Bucket: bucket,
		GCSPrefix: cfg.conn.GCS.Prefix, DLQ: dlqw, Logger: log, Registerer: reg, RedactLogs: cfg.RedactLogs,
	})
	if err != nil {
		return err
	}

	probes := []pipeline.Probe{
		{Name: "redis", Check: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }},
		{Name: "kafka", Check: dlqClient.Ping},
		{Name: "gcs", Check: func(ctx context.Context) error {
			return bucket.Iter(ctx, strings.TrimPrefix(cfg.conn.GCS.Prefix+"/.readyz", "/"), func(string) error { return nil })
		}},
	}
	// The HTTP server is the run's too: its failure ends the run the way a
	// signal does (the final cycle is flushed and committed) and is the
	// run's error.
	runCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	stopHTTP := func() {}
	if cfg.conn.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.conn.HTTPAddr)
		if err != nil {
			return fmt.Errorf("http listen: %w", err)
		}
		stopHTTP = runHTTP(pipeline.HTTPListener(ln), pipeline.NewHTTPServer(pipeline.Handler(cons, reg, probes...)), log, fail)
		log.Info("http listening", "addr", ln.Addr().String())
		if onReady != nil {
			onReady(ln.Addr().String())
		}
	} else if onReady != nil {
		onReady("")
	}

	log.Info("consumer starting", "group", cfg.conn.Group, "apply_topic", cfg.conn.Kafka.ApplyTopic,
		"ddl_topic", cfg.conn.Kafka.DDLTopic, "bucket", cfg.conn.GCS.Bucket, "flows", len(registry.Flows()))
	err = cons.Run(runCtx)
	stopHTTP()
	if cause := context.Cause(runCtx); errors.Is(cause, errHTTPServer) {
		err = errors.Join(cause, err)
	}
	if err != nil {
		return err
	}
	log.Info("consumer stopped cleanly")
	return nil
}

// errHTTPServer marks a run ended by its HTTP server's failure.
var errHTTPServer = errors.New("http server")

// runHTTP serves srv on ln on a goroutine it owns. If serving fails, it
// hands the error to fail (the run's failure path: the run stops as on a
// signal and returns it). stop shuts the server down, waiting up to 5s for
// requests in flight, and returns once the goroutine has.
func runHTTP(ln net.Listener, srv *http.Server, log *slog.Logger, fail context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server failed: stopping the consumer", "err", err)
			fail(fmt.Errorf("%w: %w", errHTTPServer, err))
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
}
