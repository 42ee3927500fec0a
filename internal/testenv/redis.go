package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a private redis-server process owned by one test.
type Redis struct {
	Addr string // host:port on loopback
	URL  string // redis://host:port/0

	bin   string
	dir   string
	extra []string
	cmd   *exec.Cmd
	done  chan error
}

// StartRedis starts a redis-server on a free loopback port and stops it when
// the test ends. It fails the test if redis-server is not on PATH: tests
// never fall back to a fake.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	return startRedis(t)
}

// StartRedisCluster starts a one-node Redis Cluster (cluster mode on, all
// 16384 slots on this node) on a free loopback port; URL works with
// redis.ParseClusterURL.
func StartRedisCluster(t testing.TB) *Redis {
	t.Helper()
	r := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	cl := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer cl.Close()
	ctx := context.Background()
	if err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("cluster addslots: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := cl.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis cluster not ok: %v %s", err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func startRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found on PATH (install the Debian package redis-server): %v", err)
	}
	r := &Redis{bin: bin, dir: t.TempDir(), extra: extra}
	err = onFreePort(func(port int) error {
		r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		r.URL = "redis://" + r.Addr + "/0"
		return r.start()
	})
	if err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(r.Stop)
	return r
}

// Client returns a new go-redis client for this server, closed when the test
// ends.
func (r *Redis) Client(t testing.TB) *redis.Client {
	cl := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Stop kills the server. It is safe to call more than once.
func (r *Redis) Stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// Restart stops the server and starts it again on the same port, with an
// empty dataset (persistence is off), to test reconnect paths.
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	r.Stop()
	if err := r.start(); err != nil {
		t.Fatalf("restart redis-server: %v", err)
	}
}

func (r *Redis) start() error {
	_, port, _ := net.SplitHostPort(r.Addr)
	args := append([]string{
		"--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no",
		"--dir", r.dir, "--logfile", filepath.Join(r.dir, "redis.log"),
	}, r.extra...)
	cmd := exec.Command(r.bin, args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec redis-server: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	cl := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer cl.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			return fmt.Errorf("redis-server exited: %v: %s", err, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := cl.Ping(ctx).Err()
		cancel()
		if err == nil {
			r.cmd, r.done = cmd, done
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-done
	return fmt.Errorf("redis-server on %s did not answer PING", r.Addr)
}
