//go:build !nodev

package main

import (
	"context"
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

	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/internal/loopback"
	"github.com/flowlog/flowlog/meta"
)

// devKafka starts the embedded broker on 127.0.0.1:port (0: any free
// port), its data under dir/kafka, with the topics of kc.
func devKafka(dir string, port int, kc kafkaconf.Config) (*kfake.Cluster, error) {
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.DataDir(filepath.Join(dir, "kafka")),
		kfake.SeedTopics(4, kc.ApplyTopic), kfake.SeedTopics(1, kc.DDLTopic, kc.DLQTopic)}
	if port != 0 {
		opts = append(opts, kfake.Ports(port))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start embedded kafka: %w", err)
	}
	return c, nil
}

// devGCS starts the embedded GCS emulator on 127.0.0.1:port (0: any free
// port), its objects under dir/gcs, with bucket created.
func devGCS(dir string, port int, bucket string) (*fakestorage.Server, error) {
	root := filepath.Join(dir, "gcs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	if port == 0 {
		p, err := loopback.FreePort()
		if err != nil {
			return nil, err
		}
		port = p
	}
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme: "http", Host: "127.0.0.1", Port: uint16(port), StorageRoot: root,
	})
	if err != nil {
		return nil, fmt.Errorf("start embedded gcs on 127.0.0.1:%d: %w", port, err)
	}
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: bucket})
	return srv, nil
}

// devRedis uses the Redis at rc.URL if it answers. Otherwise it uses a
// private redis-server under dir/redis: the one an earlier dev run left
// running, or a new one on port (0: any free port); failing that (no redis-server installed), an
// in-process emulator whose data is lost at exit, with a loud warning. It
// points rc.URL at the Redis it chose; stop stops a private server with
// SHUTDOWN SAVE, so that the next dev run continues from its data.
func devRedis(ctx context.Context, rc *meta.Config, port int, dir string, log *slog.Logger) (stop func(), err error) {
	tried := cli.RedactURL(rc.URL)
	rdir := filepath.Join(dir, "redis")
	addrFile := filepath.Join(rdir, "addr")
	var left string // a private redis-server an earlier dev run left running
	if b, err := os.ReadFile(addrFile); err == nil {
		left = strings.TrimSpace(string(b))
	}
	if pingURL(ctx, *rc) == nil {
		if left != "" && hostPort(rc.URL) == left {
			log.Info("dev: using the private redis-server of --redis-url", "addr", left, "data_dir", rdir)
			return func() { shutdownRedis(left, nil, addrFile, log) }, nil
		}
		log.Info("dev: using Redis at --redis-url", "redis", tried)
		return func() {}, nil
	}
	if left != "" && pingURL(ctx, meta.Config{URL: "redis://" + left + "/0"}) == nil {
		log.Warn("!!! Redis at --redis-url is not reachable: using the private redis-server an earlier dev run left running",
			"redis_url_tried", tried, "addr", left, "data_dir", rdir)
		rc.URL, rc.Cluster = "redis://"+left+"/0", false
		return func() { shutdownRedis(left, nil, addrFile, log) }, nil
	}
	if port == 0 {
		if port, err = loopback.FreePort(); err != nil {
			return nil, err
		}
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if bin, lerr := exec.LookPath("redis-server"); lerr == nil {
		proc, err := startRedisServer(ctx, bin, rdir, port)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(addrFile, []byte(addr+"\n"), 0o644); err != nil {
			shutdownRedis(addr, proc, "", log)
			return nil, err
		}
		log.Warn("!!! Redis at --redis-url is not reachable: started a private redis-server for dev runs; "+
			"its data stays in data_dir (saved when dev stops) and the next dev run continues from it",
			"redis_url_tried", tried, "addr", addr, "data_dir", rdir)
		rc.URL, rc.Cluster = "redis://"+addr+"/0", false
		return func() { shutdownRedis(addr, proc, addrFile, log) }, nil
	}
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr(addr); err != nil {
		return nil, fmt.Errorf("start embedded redis: %w", err)
	}
	log.Warn("!!! Redis at --redis-url is not reachable and redis-server is not installed: using an EMBEDDED IN-MEMORY "+
		"Redis emulator; its metadata is LOST when dev stops, while Kafka and GCS keep their data: remove data_dir before the next run",
		"redis_url_tried", tried, "data_dir", dir)
	rc.URL, rc.Cluster = "redis://"+addr+"/0", false
	return mr.Close, nil
}

// pingURL reports whether Redis at c.URL answers within a second. A
// refused connection is found by a plain dial first, without go-redis's
// retries and log lines.
func pingURL(ctx context.Context, c meta.Config) error {
	if opt, err := redis.ParseURL(c.URL); err == nil && !c.Cluster && opt.Network == "tcp" {
		conn, err := net.DialTimeout("tcp", opt.Addr, time.Second)
		if err != nil {
			return err
		}
		conn.Close()
	}
	cl, err := c.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cl.Ping(ctx).Err()
}

// redisProc is a private redis-server process.
type redisProc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has been waited for
}

// startRedisServer starts redis-server on 127.0.0.1:port with its data
// (append-only file and snapshot) in dir, in a process group of its own so
// that a Ctrl-C on the terminal does not stop it before the consumer's
// final commit, and waits until it answers.
func startRedisServer(ctx context.Context, bin, dir string, port int) (*redisProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logFile := filepath.Join(dir, "redis.log")
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--logfile", logFile)
	ownProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	p := &redisProc{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	url := "redis://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/0"
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-p.exited:
			return nil, fmt.Errorf("redis-server exited at start; see %s", logFile)
		case <-ctx.Done():
			p.kill()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if pingURL(ctx, meta.Config{URL: url}) == nil {
			return p, nil
		}
	}
	p.kill()
	return nil, fmt.Errorf("redis-server on port %d did not answer in 10s; see %s", port, logFile)
}

// kill kills the process and waits for it.
func (p *redisProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// shutdownRedis stops the private redis-server at addr with SHUTDOWN SAVE
// (its data is kept for the next dev run), and removes addrFile once it is
// down. A process of this run (p not nil) that does not stop within 10s is
// killed.
func shutdownRedis(addr string, p *redisProc, addrFile string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	err := cl.ShutdownSave(ctx).Err()
	cl.Close()
	stopped := err == nil // go-redis reads the closed connection of a server that quit as success
	if p != nil {
		select {
		case <-p.exited:
			stopped = true
		case <-ctx.Done():
			log.Warn("dev: private redis-server did not stop in 10s; killing it (writes since its last save are lost)", "addr", addr)
			p.kill()
			stopped = true
		}
	}
	if !stopped {
		log.Warn("dev: private redis-server did not shut down; it keeps running", "addr", addr, "err", err)
		return
	}
	if addrFile != "" {
		_ = os.Remove(addrFile)
	}
}
