package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// TestBrokerOutages: during a load, the broker first stops answering for
// 8 s (SIGSTOP: its connections stay open, requests hang, as a broker in a
// long GC pause or on a dead disk does), then dies (SIGKILL) and comes back
// on the same address with its data. The consumer rides both out by
// itself (its group session is lost and rejoined), and every event is
// backed up exactly once with the offsets at the ends. On Apache Kafka
// this is the real broker's recovery (log recovery, group coordinator
// reload); on kfake its data dir with --sync.
func TestBrokerOutages(t *testing.T) {
	const partitions = 4
	var b *broker
	if brokerKind(t) == "kfake" {
		b = startKfakeBroker(t, partitions, "--sync")
	} else {
		b = startBroker(t, partitions)
	}
	c := &cluster{Broker: b, GCS: startGCS(t), Redis: testenv.StartRedis(t)}
	load := faultLoad(40_000, 4001, time.Date(2026, 8, 1, 10, 0, 0, 0, time.UTC))
	want := faultExpect(load)
	runProducer(t, "flow", "create", "--brokers", b.Addr, "--name", faultFlow, "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-1", "--session-timeout", crashSessionTimeout)
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	l := crashLoadAsync(t, c, load, 1500) // about 27 s
	checkpointAbove := func(ts uint64) func() (bool, string) {
		return func() (bool, string) {
			st, err := faultFlowState(store)
			return err == nil && st.CheckpointTS > ts, fmt.Sprintf("flow checkpoint %d, want above %d (%v)", st.CheckpointTS, ts, err)
		}
	}
	waitFor(t, time.Minute, checkpointAbove(0))

	b.Signal(syscall.SIGSTOP)
	t.Log("broker frozen")
	time.Sleep(8 * time.Second) // the length of the outage, not a wait for a result
	b.Signal(syscall.SIGCONT)
	st, _ := faultFlowState(store)
	waitFor(t, 2*time.Minute, checkpointAbove(st.CheckpointTS))
	t.Log("checkpoint moving again after the freeze")

	b.Kill()
	st, _ = faultFlowState(store)
	b.Restart(t)
	t.Log("broker killed and restarted")
	waitFor(t, 2*time.Minute, checkpointAbove(st.CheckpointTS))

	l.Wait(t)
	got, dup := faultCheckBackup(t, c, want, 3*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkOffsetsAtEnd(ctx, t, b.Addr, "flowlog", store, partitions)
	if !cons.Running() {
		t.Fatalf("consumer exited across the broker outages: %v", cons.Wait())
	}
	t.Logf("%d events of the flow backed up across a broker freeze and a broker crash, in %d chunks (%d duplicates)", want.total, got.chunks, dup)
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}
