package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
)

// devConfig is what `consumer dev` takes on top of run's flags.
type devConfig struct {
	run     runConfig
	DataDir string
	Events  int
	Keep    bool
}

// runDev runs flowlog end to end on a bare machine: an in-process Kafka
// broker (kfake) and GCS emulator (fake-gcs-server, on disk), Redis at
// --redis-url if it answers, else an embedded one; then a demo flow and load,
// and a summary of what landed where.
func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consumer dev", flag.ContinueOnError)
	var cfg devConfig
	cfg.run.RegisterFlags(fs)
	fs.StringVar(&cfg.DataDir, "data-dir", ".flowlog-dev", "where the embedded broker and GCS emulator keep their data")
	fs.IntVar(&cfg.Events, "events", 20000, "row mutations of the demo load")
	fs.BoolVar(&cfg.Keep, "keep-running", false, "keep consuming after the demo load is backed up, until interrupted")
	_ = fs.Set("flush-interval", "2s")
	_ = fs.Set("flush-size", "8MiB")
	_ = fs.Set("max-temp-bytes", "256MiB")
	_ = fs.Set("log-format", "text")
	_ = fs.Set("store-id", "dev")
	_ = fs.Set("http-addr", "127.0.0.1:0")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	log := newLogger(cfg.run.LogFormat)
	ctx, stop := signalContext(ctx, log)
	defer stop()

	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return err
	}
	cfg.run.pipe.TempDir = filepath.Join(dir, "temp")

	// Kafka.
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(filepath.Join(dir, "kafka")),
		kfake.SeedTopics(4, cfg.run.conn.Kafka.ApplyTopic),
		kfake.SeedTopics(1, cfg.run.conn.Kafka.DDLTopic, cfg.run.conn.Kafka.DLQTopic))
	if err != nil {
		return fmt.Errorf("start embedded kafka: %w", err)
	}
	defer kafka.Close()
	cfg.run.conn.Kafka.Brokers = strings.Join(kafka.ListenAddrs(), ",")

	// GCS.
	gcsRoot := filepath.Join(dir, "gcs")
	if err := os.MkdirAll(gcsRoot, 0o755); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	gcsSrv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme: "http", Host: "127.0.0.1", Port: uint16(port), StorageRoot: gcsRoot,
	})
	if err != nil {
		return fmt.Errorf("start embedded gcs: %w", err)
	}
	defer gcsSrv.Stop()
	gcsSrv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: cfg.run.conn.GCS.Bucket})
	cfg.run.conn.GCS.Endpoint = gcsSrv.URL()

	// Redis.
	stopRedis, err := devRedis(ctx, &cfg.run.conn.Redis, dir, log)
	if err != nil {
		return err
	}
	defer stopRedis()

	if err := cfg.run.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	log.Info("dev: embedded services up", "kafka", cfg.run.conn.Kafka.Brokers, "gcs", gcsSrv.URL(),
		"bucket", cfg.run.conn.GCS.Bucket, "redis", cli.RedactURL(cfg.run.conn.Redis.URL), "data_dir", dir)

	gen, err := devLoad(ctx, cfg)
	if err != nil {
		return err
	}

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	errc := make(chan error, 1)
	go func() { errc <- serve(runCtx, cfg.run, log, nil) }()

	rdb, err := cfg.run.conn.Redis.NewClient()
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := meta.NewStore(rdb, cfg.run.conn.Redis.Prefix, nil)
	target := gen.MaxResolvedTS()
	deadline := time.Now().Add(3 * time.Minute)
	var ck uint64
	for ck < target {
		select {
		case err := <-errc:
			return fmt.Errorf("consumer stopped early: %w", err)
		case <-ctx.Done():
			cancelRun()
			return <-errc
		case <-time.After(500 * time.Millisecond):
		}
		if id, ok, err := store.FlowIDByName(ctx, "default", "demo"); err == nil && ok {
			if st, err := store.FlowState(ctx, id); err == nil {
				ck = st.CheckpointTS
			}
		}
		if time.Now().After(deadline) {
			cancelRun()
			<-errc
			return fmt.Errorf("checkpoint %d did not reach the load's last resolved ts %d in 3m", ck, target)
		}
	}
	if cfg.Keep {
		log.Info("dev: demo load backed up; still running (Ctrl-C to stop)")
		<-ctx.Done()
	}
	cancelRun()
	if err := <-errc; err != nil {
		return err
	}
	return devSummary(ctx, cfg, store, gen, ck)
}

// devRedis uses the configured Redis if it answers; otherwise it starts a
// redis-server from PATH, or an in-process miniredis, with a loud warning.
func devRedis(ctx context.Context, rc *meta.Config, dir string, log *slog.Logger) (func(), error) {
	if opt, err := redis.ParseURL(rc.URL); err == nil {
		if conn, err := net.DialTimeout("tcp", opt.Addr, time.Second); err == nil {
			conn.Close()
			cl, err := rc.NewClient()
			if err == nil {
				pctx, cancel := context.WithTimeout(ctx, time.Second)
				err = cl.Ping(pctx).Err()
				cancel()
				cl.Close()
				if err == nil {
					return func() {}, nil
				}
			}
		}
	}
	port, perr := freePort()
	if perr != nil {
		return nil, perr
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if bin, lerr := exec.LookPath("redis-server"); lerr == nil {
		rdir := filepath.Join(dir, "redis")
		if err := os.MkdirAll(rdir, 0o755); err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", rdir,
			"--logfile", filepath.Join(rdir, "redis.log"))
		if err := cmd.Start(); err == nil {
			probe := redis.NewClient(&redis.Options{Addr: addr})
			for range 100 {
				if probe.Ping(ctx).Err() == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			probe.Close()
			log.Warn("!!! Redis at --redis-url is not reachable: started a private redis-server for this dev run; its data lives in "+rdir, "redis_url_tried", cli.RedactURL(rc.URL), "addr", addr)
			rc.URL = "redis://" + addr + "/0"
			return func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }, nil
		}
	}
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr(addr); err != nil {
		return nil, fmt.Errorf("start embedded redis: %w", err)
	}
	log.Warn("!!! Redis at --redis-url is not reachable and redis-server is not installed: using an EMBEDDED IN-MEMORY Redis emulator for this dev run only; metadata is lost on exit", "redis_url_tried", cli.RedactURL(rc.URL))
	rc.URL = "redis://" + addr + "/0"
	return mr.Close, nil
}

// devLoad publishes the demo flow's DDL and the demo load.
func devLoad(ctx context.Context, cfg devConfig) (*loadgen.Generator, error) {
	kc := cfg.run.conn.Kafka
	opts, err := kc.Opts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts, kgo.ProducerLinger(5*time.Millisecond))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ddl, _ := json.Marshal(map[string]any{
		"op": "create", "if_not_exists": true,
		"flow": map[string]any{
			"catalog_name": "default", "flow_name": "demo", "source_table_ids": []uint32{1, 2},
			"sink_table_name": map[string]string{"catalog_name": "default", "schema_name": "public", "table_name": "demo_sink"},
			"flownode_ids":    map[string]uint64{"0": 0}, "raw_sql": "SELECT * FROM t1, t2", "comment": "consumer dev demo flow",
		},
		"routes": map[string]any{"0": map[string]any{"peer": map[string]any{"id": 0, "addr": "127.0.0.1:4000"}}},
	})
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: kc.DDLTopic, Key: []byte("demo"), Value: ddl,
		Headers: []kgo.RecordHeader{{Key: event.HeaderContentType, Value: []byte("application/json")}}}).FirstErr(); err != nil {
		return nil, fmt.Errorf("publish demo flow: %w", err)
	}
	gen := loadgen.New(loadgen.Config{Events: cfg.Events, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 128,
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

func devSummary(ctx context.Context, cfg devConfig, store *meta.Store, gen *loadgen.Generator, ck uint64) error {
	id, _, err := store.FlowIDByName(ctx, "default", "demo")
	if err != nil {
		return err
	}
	metas, err := store.Metas(ctx, id)
	if err != nil {
		return err
	}
	root := filepath.Join(cfg.DataDir, "gcs", cfg.run.conn.GCS.Bucket)
	var objects, bytes int64
	_ = filepath.Walk(root, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			objects++
			bytes += fi.Size()
		}
		return nil
	})
	fmt.Printf(`
flowlog dev run complete
  demo load:      %d row mutations (%d events) on tables 1,2,3 over 8 regions
  flow:           default/demo (id %d) on tables 1,2
  checkpoint:     %d (%s)
  meta objects:   %d referenced in Redis (%s)
  GCS objects:    %d files, %d bytes under %s
                  (fake-gcs-server's filesystem backend; layout %s/<catalog>/<flow>/v1/...)
`, gen.Transactions(), gen.Events(), id, ck, event.PhysicalTime(ck).Format(time.RFC3339Nano),
		len(metas), store.Keys().Metas(id), objects, bytes, root, orDefault(cfg.run.conn.GCS.Prefix, "<no prefix>"))
	if len(metas) > 0 {
		fmt.Printf("  first meta:     gs://%s/%s\n", cfg.run.conn.GCS.Bucket, metas[0].Path)
	}
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
