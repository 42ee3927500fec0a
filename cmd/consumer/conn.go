package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/auth/credentials"
	"cloud.google.com/go/storage"
	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// connConfig is how the consumer's commands reach Kafka, Redis, GCS and a
// running consumer's HTTP server. Every command registers Redis, GCS, the
// group and the clock bound; only those that talk to Kafka or to a running
// consumer register those flags too (uses), so that a command's help lists
// only what it uses. One set of FLOWLOG_* variables serves them all: a
// command reads the variables of its own flags.
type connConfig struct {
	Kafka    kafkaconf.Config
	Redis    meta.Config
	GCS      gcs.Config
	Group    string
	HTTPAddr string
	// MaxClockSkew bounds how far ahead of this machine's clock a ts may
	// lie: run refuses records past it, the operator commands a --ts, a
	// checkpoint or a window past it.
	MaxClockSkew time.Duration

	// uses is what the command talks to besides Redis and GCS; set it
	// before RegisterFlags.
	uses connUse
}

// connUse is a set of the services a command talks to besides Redis and
// GCS.
type connUse uint8

const (
	useKafka      connUse = 1 << iota // every Kafka flag (run, dev)
	useApplyTopic                     // the brokers and the apply topic only (status)
	useHTTP                           // --http-addr, the running consumer
	useBrokers                        // the brokers, TLS and SASL, no topic (replay)
)

// RegisterFlags registers the connection flags c.uses asks for on f.
func (c *connConfig) RegisterFlags(f *flag.FlagSet) {
	switch {
	case c.uses&useKafka != 0:
		c.Kafka.RegisterFlags(f)
	case c.uses&useApplyTopic != 0:
		c.Kafka.RegisterFlagsFor(f, kafkaconf.ApplyTopic)
	case c.uses&useBrokers != 0:
		c.Kafka.RegisterFlagsFor(f)
	}
	c.Redis.RegisterFlags(f)
	c.GCS.RegisterFlags(f)
	f.StringVar(&c.Group, "group", "flowlog", "Kafka consumer group; also names the global_checkpoint object")
	f.DurationVar(&c.MaxClockSkew, "max-clock-skew", pipeline.DefaultMaxClockSkew,
		"how far ahead of this machine's clock a ts may lie: run sends records past it to the DLQ (reason ts_future), restore and snapshot refuse a --ts or checkpoint past it, verify reports it")
	if c.uses&useHTTP != 0 {
		f.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:8080",
			"the consumer's HTTP address: run serves /metrics, /healthz, /readyz, /status and POST /flush there, status reads its /status (empty: off)")
	}
}

// Validate reports every problem, one per line.
func (c *connConfig) Validate() error {
	var errs []error
	if c.uses&(useKafka|useApplyTopic|useBrokers) != 0 {
		errs = append(errs, c.Kafka.Validate())
	}
	errs = append(errs, validateRedis(c.Redis), c.GCS.Validate())
	if !validGroup(c.Group) {
		errs = append(errs, fmt.Errorf("--group %q: must be 1 to 128 characters of [A-Za-z0-9._-] (it becomes part of object names)", c.Group))
	}
	if c.MaxClockSkew <= 0 {
		errs = append(errs, errors.New("--max-clock-skew: must be positive"))
	}
	return errors.Join(errs...)
}

// parseOpen parses args into fs (where c's flags are registered), validates
// c and the command's own flags (check, if not nil, before anything is
// contacted) and opens the metadata store: the start of every operator
// command. Positional arguments are refused.
func (c *connConfig) parseOpen(fs *flag.FlagSet, args []string, check ...func() error) (*meta.Store, func(), error) {
	if err := c.parse(fs, args, check...); err != nil {
		return nil, nil, err
	}
	return c.openStore()
}

// parse is parseOpen without opening the store: a command reading the
// bucket alone (--from-bucket) never connects to Redis.
func (c *connConfig) parse(fs *flag.FlagSet, args []string, check ...func() error) error {
	src, err := cli.ParseSources(fs, args)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments %q", fs.Args())
	}
	if err := c.Validate(); err != nil {
		return invalidConfig(src, err)
	}
	for _, fn := range check {
		if err := fn(); err != nil {
			return &cli.UsageError{Err: src.Annotate(err)}
		}
	}
	return nil
}

// invalidConfig is the usage error of a configuration that failed its
// Validate: the problems one per line, each naming the FLOWLOG_* variable
// that set it, if one did.
func invalidConfig(src cli.Sources, err error) error {
	return &cli.UsageError{Err: fmt.Errorf("invalid configuration:\n%w", src.Annotate(err))}
}

// openBackup opens the bucket and the store a reading command takes its
// flows, windows and metas from: the bucket alone with fromBucket (no
// Redis connection at all, parallel metas read at once), else Redis. The
// func closes both.
func (c *connConfig) openBackup(ctx context.Context, fromBucket bool, parallel int) (sink.Bucket, backup.Store, func(), error) {
	b, err := c.openBucket(ctx, false)
	if err != nil {
		return nil, nil, nil, err
	}
	if fromBucket {
		return b, &backup.BucketStore{Bucket: b, Prefix: c.GCS.Prefix, Group: c.Group, Parallel: parallel}, func() { b.Close() }, nil
	}
	st, closeStore, err := c.openStore()
	if err != nil {
		b.Close()
		return nil, nil, nil, err
	}
	return b, st, func() { closeStore(); b.Close() }, nil
}

// openStore connects to Redis. The store has no metrics registry: operator
// commands are short-lived.
func (c *connConfig) openStore() (*meta.Store, func(), error) {
	rdb, err := c.Redis.NewClient()
	if err != nil {
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	if err := pingRedis(context.Background(), rdb, c.Redis.URL); err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return meta.NewStore(rdb, c.Redis.Prefix, nil), func() { rdb.Close() }, nil
}

// redisAnswerTimeout bounds the first command a command sends to Redis.
const redisAnswerTimeout = 5 * time.Second

// pingRedis checks that Redis at url answers, so that an unreachable or
// silent Redis is reported once, naming its address (password redacted),
// instead of as the failure of whatever command came first.
func pingRedis(ctx context.Context, rdb redis.UniversalClient, url string) error {
	ctx, cancel := context.WithTimeout(ctx, redisAnswerTimeout)
	defer cancel()
	err := rdb.Ping(ctx).Err()
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil || isTimeout(err):
		// The connection's deadline is the context's, so its read can time
		// out a moment before the context's own timer marks it done (seen
		// on a loaded machine): both mean Redis did not answer in time.
		return fmt.Errorf("redis at %s did not answer within %v: %w", cli.RedactURL(url), redisAnswerTimeout, err)
	}
	return fmt.Errorf("redis at %s: %w", cli.RedactURL(url), err)
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// redisLog is go-redis's logger (redis.SetLogger): its own lines (a pool
// that failed to dial, and the like) go to log at debug level, or nowhere
// when log is nil, instead of unstructured lines on stderr. The failures
// that matter reach the caller as errors, which the consumer reports once,
// naming Redis (pingRedis): with Redis down, the operator reads that one
// line, not the pool's retries before it.
type redisLog struct{ log *slog.Logger }

// Printf implements go-redis's internal.Logging.
func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	if r.log != nil {
		r.log.DebugContext(ctx, "redis client: "+strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
	}
}

// openBucket connects to the GCS bucket and checks that it exists and can
// be listed under --gcs-prefix and, with write, that objects can be created
// and deleted there (sink.CheckAccess), so that a wrong --gcs-bucket or a
// missing permission is one line naming the bucket instead of the failure
// of a later read or upload.
func (c *connConfig) openBucket(ctx context.Context, write bool) (sink.Bucket, error) {
	if err := checkGCSCredentials(c.GCS); err != nil {
		return nil, err
	}
	b, err := gcs.New(ctx, c.GCS)
	if err != nil {
		return nil, err
	}
	warn := func(err error) { fmt.Fprintf(os.Stderr, "warning: %v\n", err) }
	if err := checkBucket(ctx, b, c.GCS, write, warn); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// bucketCheckTimeout bounds the start's bucket check: a GCS that does not
// answer is reported, not waited for.
const bucketCheckTimeout = 30 * time.Second

// checkBucket is the start's bucket check of cfg's bucket b, worded. A
// probe write that failed without GCS refusing it (a 5xx, a reset, a
// timeout: what a retry may cure) does not stop the command: it goes to
// warn, and the command goes on, its own writes retried as always. A
// refusal (no such bucket, no permission) and a bucket that cannot be
// listed stop it.
func checkBucket(ctx context.Context, b sink.Bucket, cfg gcs.Config, write bool, warn func(error)) error {
	ctx, cancel := context.WithTimeout(ctx, bucketCheckTimeout)
	defer cancel()
	err := sink.CheckAccess(ctx, b, cfg.Prefix, write)
	where := "gcs bucket " + strconv.Quote(cfg.Bucket)
	if cfg.Endpoint != "" {
		where += " at " + cfg.Endpoint
	}
	var pw *sink.ProbeWriteError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pw) && !gcs.IsRefusal(err):
		warn(fmt.Errorf("%s lists under --gcs-prefix %q but its write probe failed without a refusal (going on; writes are retried): %w", where, cfg.Prefix, err))
		return nil
	case errors.Is(err, sink.ErrBucketNotExist):
		return fmt.Errorf("%s does not exist (--gcs-bucket)", where)
	case ctx.Err() != nil:
		return fmt.Errorf("%s did not answer within %v: %w", where, bucketCheckTimeout, err)
	case write:
		return fmt.Errorf("%s is not readable and writable under --gcs-prefix %q: %w", where, cfg.Prefix, err)
	}
	return fmt.Errorf("%s is not readable under --gcs-prefix %q: %w", where, cfg.Prefix, err)
}

// errNoGCS is the one-line answer to a command that would talk to real GCS
// without credentials: the first thing a newcomer who runs `consumer` sees.
var errNoGCS = errors.New("no GCS configured: set --gcs-endpoint (or STORAGE_EMULATOR_HOST) for an emulator, " +
	"or Google credentials (GOOGLE_APPLICATION_CREDENTIALS) for GCS; 'consumer dev' runs everything locally")

// checkGCSCredentials returns errNoGCS when c names real GCS (no endpoint,
// no STORAGE_EMULATOR_HOST) and the standard credential search finds
// nothing, before the GCS client fails with a longer message.
func checkGCSCredentials(c gcs.Config) error {
	if c.Endpoint != "" || os.Getenv("STORAGE_EMULATOR_HOST") != "" {
		return nil
	}
	if _, err := credentials.DetectDefault(&credentials.DetectOptions{Scopes: []string{storage.ScopeReadWrite}}); err != nil {
		return errNoGCS
	}
	return nil
}
