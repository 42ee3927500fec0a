package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// slowloris holds n connections to addr open, each sending request
// headers one line a second and never finishing them; a connection the
// server closes is opened again at once. It stops when the test ends or
// stop is called.
type slowloris struct {
	stopped chan struct{}
	wg      sync.WaitGroup
	dials   atomic.Int64
	once    sync.Once
}

func startSlowloris(t *testing.T, addr string, n int) *slowloris {
	s := &slowloris{stopped: make(chan struct{})}
	for range n {
		s.wg.Go(func() {
			for {
				select {
				case <-s.stopped:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					select {
					case <-s.stopped:
						return
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				s.dials.Add(1)
				go func() { _, _ = io.Copy(io.Discard, c) }() // sees the server's close
				_, err = io.WriteString(c, "GET /status HTTP/1.1\r\nHost: flowlog\r\n")
				for err == nil {
					select {
					case <-s.stopped:
						c.Close()
						return
					case <-time.After(time.Second):
					}
					_, err = io.WriteString(c, "X-Slow: 1\r\n")
				}
				c.Close()
			}
		})
	}
	t.Cleanup(s.stop)
	return s
}

func (s *slowloris) stop() {
	s.once.Do(func() { close(s.stopped) })
	s.wg.Wait()
}

// TestHostileSlowloris: under `ulimit -n 256`, 400 connections that send
// their HTTP headers a line a second, reopened as soon as the server drops
// them, run for the whole of a load of 2,000 regions (thousands of temp
// files). The HTTP server holds only a few of them, so temp segments,
// Kafka sockets and commits keep their descriptors: the load is backed up
// completely while the attack goes on, the log never says "too many open
// files", and once the attack stops /healthz answers at once.
func TestHostileSlowloris(t *testing.T) {
	const (
		nofile  = 256
		attack  = 400
		regions = 2000
	)
	c := startCluster(t, 4)
	load := loadgen.Config{Events: 6000, Tables: []int64{1, 2, 3}, Regions: regions, BatchSize: 1, Seed: 2406,
		StartTime: time.Date(2026, 6, 2, 10, 0, 0, 0, time.UTC)}
	want := faultExpect(load)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	cons := c.startConsumerUlimit(t, "slowloris-1", nofile)
	pid := bpPID(cons)
	if got := procLimit(pid, "Max open files"); got != nofile {
		t.Fatalf("consumer runs with an open file limit of %d, want %d", got, nofile)
	}
	fds := testenv.SampleFDs(t, pid, 20*time.Millisecond)
	lor := startSlowloris(t, cons.Addr, attack)
	// The attack is on before the load, and long enough for the server to
	// have dropped some slow clients (each reconnects at once).
	waitFor(t, 2*time.Minute, func() (bool, string) {
		return lor.dials.Load() >= attack+64, fmt.Sprintf("%d slowloris connections opened", lor.dials.Load())
	})
	start := time.Now()
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load)...)...)
	waitCheckpointOrExit(t, c, cons, want.maxResolved, 3*time.Minute)
	took := time.Since(start)
	got, dup := faultCheckBackup(t, c, want, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", meta.NewStore(c.Redis.Client(t), "flowlog", nil), 4)
	dials := lor.dials.Load()
	lor.stop()
	peak := fds.Halt()
	t.Logf("%d events of the flow backed up in %d chunks (%d duplicates) in %v during a slowloris of %d connections (%d opened in all); open descriptors peaked at %d of %d",
		want.total, got.chunks, dup, took.Round(time.Millisecond), attack, dials, peak, nofile)
	if peak >= nofile {
		t.Errorf("open descriptors reached the limit (%d of %d)", peak, nofile)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		cl := &http.Client{Timeout: 2 * time.Second}
		resp, err := cl.Get("http://" + cons.Addr + "/healthz")
		if err != nil {
			return false, "/healthz after the attack: " + err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, "/healthz after the attack: " + resp.Status
	})
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
	if log := cons.Log(); strings.Contains(log, "too many open files") {
		t.Errorf("consumer log mentions \"too many open files\"")
	}
}
