//go:build !nodev

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
)

// devConfig is what `consumer dev` takes on top of run's flags.
type devConfig struct {
	run       runConfig
	DataDir   string
	Events    int
	Keep      bool
	Heartbeat time.Duration

	kafkaPort int  // port of the embedded broker; 0: any free one
	gcsPort   int  // port of the embedded GCS emulator; 0: any free one
	redisPort int  // port for a private redis-server; 0: any free one
	strict    bool // kafkaPort and gcsPort were given: no other port will do
	tempDir   bool // --temp-dir was given: use it, not DataDir/temp
}

// devRegions is the number of regions of the demo load.
const devRegions = 8

// devDefaults are dev's defaults for run's flags: fast cycles, text logs,
// an HTTP port of its own.
var devDefaults = map[string]string{
	"flush-interval": "2s", "flush-size": "8MiB", "max-temp-bytes": "256MiB",
	"log-format": "text", "store-id": "dev", "http-addr": "127.0.0.1:0",
}

// devSections are the help sections of `consumer dev`.
var devSections = append([]cli.Section{{Title: "Dev", Names: []string{"data-dir", "events", "keep-running", "heartbeat-interval"}}}, runSections...)

// runDev runs flowlog end to end on a bare machine: an in-process Kafka
// broker (kfake) and GCS emulator (fake-gcs-server, on disk), Redis at
// --redis-url if it answers, else a private one; then a demo flow and load,
// and a summary of what landed where.
func runDev(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("consumer dev", intro("dev"), "Dev", devSections...)
	var cfg devConfig
	cfg.run.RegisterFlags(fs)
	fs.StringVar(&cfg.DataDir, "data-dir", ".flowlog-dev", "where the embedded broker, GCS emulator and private Redis keep their data, and env is written")
	fs.IntVar(&cfg.Events, "events", 20000, "row mutations of the demo load")
	fs.BoolVar(&cfg.Keep, "keep-running", false, "keep consuming after the demo load is backed up, until interrupted")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat-interval", time.Second,
		"with --keep-running, how often every demo region's resolved ts is advanced to now, so the checkpoint keeps up")
	for name, v := range devDefaults {
		f := fs.Lookup(name)
		_ = f.Value.Set(v) // not fs.Set: the flag stays "not given"
		f.DefValue = v
	}
	src, err := cli.ParseSources(fs, args)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := cfg.place(given); err != nil {
		return err
	}

	log := newLogger(cfg.run.LogFormat)
	ctx, stop := signalContext(ctx, log, cfg.run.pipe.ShutdownTimeout)
	defer stop()

	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return err
	}
	if !cfg.tempDir {
		cfg.run.pipe.TempDir = filepath.Join(dir, "temp")
	}
	kafka, err := devKafka(dir, cfg.kafkaPort, cfg.run.conn.Kafka)
	if err != nil && cfg.kafkaPort != 0 && !cfg.strict {
		kafka, err = devKafka(dir, 0, cfg.run.conn.Kafka) // the earlier run's port was taken meanwhile
	}
	if err != nil {
		return err
	}
	defer kafka.Close()
	cfg.run.conn.Kafka.Brokers = strings.Join(kafka.ListenAddrs(), ",")
	gcsSrv, err := devGCS(dir, cfg.gcsPort, cfg.run.conn.GCS.Bucket)
	if err != nil && cfg.gcsPort != 0 && !cfg.strict {
		gcsSrv, err = devGCS(dir, 0, cfg.run.conn.GCS.Bucket)
	}
	if err != nil {
		return err
	}
	defer gcsSrv.Stop()
	cfg.run.conn.GCS.Endpoint = gcsSrv.URL()
	stopRedis, err := devRedis(ctx, &cfg.run.conn.Redis, cfg.redisPort, dir, log)
	if err != nil {
		return err
	}
	defer stopRedis()
	redis.SetLogger(redisLog{log: log}) // not before: devRedis's probes fail on purpose

	if err := cfg.run.Validate(); err != nil {
		return invalidConfig(src, err)
	}
	log.Info("dev: embedded services up", "kafka", cfg.run.conn.Kafka.Brokers, "gcs", gcsSrv.URL(),
		"bucket", cfg.run.conn.GCS.Bucket, "redis", cli.RedactURL(cfg.run.conn.Redis.URL), "data_dir", dir)

	gen, err := devLoad(ctx, cfg)
	if err != nil {
		return err
	}
	return devServe(ctx, cfg, gen, log)
}

// place checks the flags dev cannot honour and takes the listen addresses
// of the embedded services from those it can (--brokers, --gcs-endpoint,
// --http-addr, a loopback --redis-url for a private redis-server), else
// from the earlier run's env file if those ports are free, so that a
// sourced env file stays valid. Every problem is one line.
func (c *devConfig) place(given map[string]bool) error {
	kc := c.run.conn.Kafka
	if kc.TLS || kc.TLSCAFile != "" || kc.TLSCertFile != "" || kc.SASLMechanism != "" || kc.SASLUser != "" || kc.SASLPassword != "" {
		return cli.Usagef("--kafka-tls*, --kafka-sasl-*: dev's embedded Kafka has neither TLS nor SASL; use 'consumer run' against a secured Kafka")
	}
	if c.Heartbeat <= 0 {
		return cli.Usagef("--heartbeat-interval %v: must be positive", c.Heartbeat)
	}
	c.tempDir = given["temp-dir"]
	prev := readDevEnv(filepath.Join(c.DataDir, devEnvFile))
	remembered := func(addr string) int {
		if p, ok := loopbackPort(addr); ok && portFree(p) {
			return p
		}
		return 0
	}
	if given["brokers"] {
		port, ok := loopbackPort(kc.Brokers)
		if !ok {
			return cli.Usagef("--brokers %q: dev runs its own Kafka, on 127.0.0.1:PORT; give one such address or none (use 'consumer run' for another Kafka)", kc.Brokers)
		}
		c.kafkaPort, c.strict = port, true
	} else {
		c.kafkaPort = remembered(prev[cli.EnvName("brokers")])
	}
	if given["gcs-endpoint"] {
		port, ok := loopbackPort(hostPort(c.run.conn.GCS.Endpoint))
		if !ok {
			return cli.Usagef("--gcs-endpoint %q: dev runs its own GCS emulator, on http://127.0.0.1:PORT; give one such address or none", c.run.conn.GCS.Endpoint)
		}
		c.gcsPort, c.strict = port, true
	} else {
		c.gcsPort = remembered(hostPort(prev[cli.EnvName("gcs-endpoint")]))
	}
	if !given["http-addr"] {
		if p := remembered(prev[cli.EnvName("http-addr")]); p != 0 {
			c.run.conn.HTTPAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		}
	}
	if given["redis-url"] {
		c.redisPort = remembered(hostPort(c.run.conn.Redis.URL))
	}
	if c.redisPort == 0 {
		c.redisPort = remembered(hostPort(prev[cli.EnvName("redis-url")]))
	}
	return nil
}

// hostPort is the host:port of a URL such as http://h:p/ or redis://h:p/0
// without user info ("" for one with), or s itself if it has no scheme.
func hostPort(s string) string {
	_, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if strings.Contains(rest, "@") {
		return ""
	}
	return rest
}

// loopbackPort is the port of "127.0.0.1:PORT" or "localhost:PORT".
func loopbackPort(addr string) (int, bool) {
	host, p, err := net.SplitHostPort(strings.TrimSpace(addr))
	if err != nil || (host != "127.0.0.1" && host != "localhost") {
		return 0, false
	}
	port, err := strconv.Atoi(p)
	return port, err == nil && port > 0 && port < 65536
}

// devServe runs the consumer until the demo load is backed up (and, with
// --keep-running, until interrupted, sending heartbeats), then prints the
// summary. An interruption is a clean stop: the consumer finishes its
// cycle and the summary is printed all the same.
func devServe(ctx context.Context, cfg devConfig, gen *loadgen.Generator, log *slog.Logger) error {
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	errc := make(chan error, 1)
	ready := make(chan string, 1)
	go func() { errc <- serve(runCtx, cfg.run, log, func(addr string) { ready <- addr }) }()
	select {
	case addr := <-ready:
		cfg.run.conn.HTTPAddr = addr
	case err := <-errc:
		return fmt.Errorf("consumer stopped early: %w", err)
	}
	envFile, err := writeDevEnv(cfg)
	if err != nil {
		return err
	}

	rdb, err := cfg.run.conn.Redis.NewClient()
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := meta.NewStore(rdb, cfg.run.conn.Redis.Prefix, nil)
	err = awaitCheckpoint(ctx, store, gen.MaxResolvedTS(), errc)
	interrupted := errors.Is(err, context.Canceled) && ctx.Err() != nil
	if err != nil && !interrupted {
		cancelRun()
		<-errc
		return err
	}
	hb := make(chan struct{})
	if cfg.Keep && !interrupted {
		if err := devSummary(ctx, os.Stdout, cfg, store, gen, envFile, true); err != nil {
			return err
		}
		log.Info("dev: demo load backed up; still running (Ctrl-C to stop)")
		go func() {
			defer close(hb)
			devHeartbeats(ctx, cfg.run.conn.Kafka, cfg.Heartbeat, gen.MaxResolvedTS(), log)
		}()
		<-ctx.Done()
	} else {
		close(hb)
	}
	cancelRun()
	<-hb
	if err := <-errc; err != nil {
		return err
	}
	if interrupted {
		log.Warn("dev: interrupted before the demo load was backed up")
	}
	// ctx may be canceled by now: the summary reads Redis on its own.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return devSummary(sctx, os.Stdout, cfg, store, gen, envFile, false)
}

// awaitCheckpoint polls the demo flow's checkpoint until it reaches
// target. It returns ctx's error if ctx ends first, and the consumer's if
// it stops.
func awaitCheckpoint(ctx context.Context, store *meta.Store, target uint64, errc <-chan error) error {
	deadline := time.Now().Add(3 * time.Minute)
	var ck uint64
	for ck < target {
		select {
		case err := <-errc:
			return fmt.Errorf("consumer stopped early: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		ck, _, _ = demoCheckpoint(ctx, store)
		if time.Now().After(deadline) {
			return fmt.Errorf("checkpoint %d did not reach the load's last resolved ts %d in 3m", ck, target)
		}
	}
	return nil
}

// demoCheckpoint returns the demo flow's checkpoint and id.
func demoCheckpoint(ctx context.Context, store *meta.Store) (uint64, meta.FlowID, error) {
	id, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, "demo")
	if err != nil || !ok {
		return 0, 0, err
	}
	st, err := store.FlowState(ctx, id)
	if err != nil {
		return 0, id, err
	}
	return st.CheckpointTS, id, nil
}

// devProducer is a client for the embedded broker.
func devProducer(kc kafkaconf.Config) (*kgo.Client, error) {
	opts, err := kc.Opts()
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(opts, kgo.ProducerLinger(5*time.Millisecond))...)
}

// devLoad publishes the demo flow's DDL and the demo load.
func devLoad(ctx context.Context, cfg devConfig) (*loadgen.Generator, error) {
	kc := cfg.run.conn.Kafka
	cl, err := devProducer(kc)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: kc.DDLTopic, Key: []byte("demo"), Value: demoFlowDDL,
		Headers: []kgo.RecordHeader{{Key: event.HeaderContentType, Value: []byte("application/json")}}}).FirstErr(); err != nil {
		return nil, fmt.Errorf("publish demo flow: %w", err)
	}
	gen := loadgen.New(loadgen.Config{Events: cfg.Events, Tables: []int64{1, 2, 3}, Regions: devRegions, ValueSize: 128,
		Seed: time.Now().UnixNano(), StartTime: time.Now().Add(-time.Minute), HeartbeatEvery: 4})
	var buf []byte
	var perr error
	for {
		b, ok := gen.Next()
		if !ok {
			break
		}
		buf = event.EncodeBatch(buf[:0], b)
		cl.Produce(ctx, &kgo.Record{Topic: kc.ApplyTopic, Key: []byte(strconv.FormatUint(b.RegionID, 10)), Value: append([]byte(nil), buf...)},
			func(_ *kgo.Record, err error) {
				if err != nil && perr == nil {
					perr = err
				}
			})
	}
	if err := cl.Flush(ctx); err != nil {
		return nil, err
	}
	if perr != nil {
		return nil, fmt.Errorf("publish demo load: %w", perr)
	}
	return gen, nil
}

// demoFlowDDL creates the demo flow default/demo on tables 1 and 2.
var demoFlowDDL = []byte(`{"op":"create","if_not_exists":true,` +
	`"flow":{"catalog_name":"default","flow_name":"demo","source_table_ids":[1,2],` +
	`"sink_table_name":{"catalog_name":"default","schema_name":"public","table_name":"demo_sink"},` +
	`"flownode_ids":{"0":0},"raw_sql":"SELECT * FROM t1, t2","comment":"consumer dev demo flow"},` +
	`"routes":{"0":{"peer":{"id":0,"addr":"127.0.0.1:4000"}}}}`)

// devHeartbeats advances the resolved ts of every demo region to now (at
// least past floor, the demo load's last) every interval until ctx ends, as
// an idle TiKV does, so that the checkpoint and its lag keep moving.
func devHeartbeats(ctx context.Context, kc kafkaconf.Config, interval time.Duration, floor uint64, log *slog.Logger) {
	cl, err := devProducer(kc)
	if err != nil {
		log.Warn("dev: no heartbeats", "err", err)
		return
	}
	defer cl.Close()
	t := time.NewTicker(interval)
	defer t.Stop()
	last := floor
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			last = max(last+1, event.ComposeTS(now.UnixMilli(), 0))
			recs := make([]*kgo.Record, 0, devRegions)
			for r := uint64(1); r <= devRegions; r++ {
				recs = append(recs, &kgo.Record{Topic: kc.ApplyTopic, Key: []byte(strconv.FormatUint(r, 10)),
					Value: event.EncodeBatch(nil, &event.Batch{RegionID: r, ResolvedTS: last})})
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil && ctx.Err() == nil {
				log.Warn("dev: heartbeat not published", "err", err)
			}
		}
	}
}
