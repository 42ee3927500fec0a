//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// BenchmarkReplayCommand: `consumer replay`, --mode log and state, of the snapshot
// benchmarks' flow (-snapbench-mib of log) into an in-process broker, as a
// process with --max-memory 64MiB. It reports the records' MB/s and the
// process's peak RSS (VmHWM), and fails if that passes --max-memory + 64
// MiB.
func BenchmarkReplayCommand(b *testing.B) {
	sb := newSnapBench(b)
	for _, mode := range []string{"log", "state"} {
		b.Run(mode, func(b *testing.B) { benchReplayCommand(b, sb, mode) })
	}
}

func benchReplayCommand(b *testing.B, sb *snapBench, mode string) {
	const maxMemory = 64
	for i := 0; b.Loop(); i++ {
		topic := fmt.Sprintf("out%d", i)
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, topic))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		args := append([]string{"replay", "--flow", "f", "--to-topic", topic, "--brokers", strings.Join(c.ListenAddrs(), ","),
			"--max-memory", fmt.Sprintf("%dMiB", maxMemory), "--json", "--mode", mode, "--temp-dir", b.TempDir()}, sb.conn...)
		cmd := consumerCmd(ctx, "", []string{"GOMEMLIMIT="}, args...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		stop, peak := make(chan struct{}), make(chan float64)
		go func() { peak <- pollHWM(cmd.Process.Pid, stop) }()
		err = cmd.Wait()
		close(stop)
		took, rss := time.Since(start), <-peak
		cancel()
		c.Close()
		if err != nil {
			b.Fatalf("replay: %v\n%s\n%s", err, stdout.String(), stderr.String())
		}
		var doc replayJSON
		if err := json.Unmarshal([]byte(stdout.String()), &doc); err != nil {
			b.Fatalf("%v in\n%s", err, stdout.String())
		}
		b.ReportMetric(float64(doc.Bytes)/1e6/took.Seconds(), "MB/s")
		b.ReportMetric(rss, "peak-RSS-MiB")
		if rss > maxMemory+64 {
			b.Errorf("peak RSS %.0f MiB with --max-memory %d MiB", rss, maxMemory)
		}
	}
}
