package e2e

import (
	"strconv"
	"syscall"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
)

// broker is the Kafka broker of a test: an Apache Kafka process
// (testenv.StartApacheKafka) or a kfakebroker process, as
// FLOWLOG_TEST_KAFKA chooses (docs/TESTING.md, "Which broker").
type broker struct {
	// Addr is the broker's host:port, for --brokers.
	Addr string
	// Kind is "apache" or "kfake".
	Kind string

	apache *testenv.ApacheKafka
	kfake  *proc
}

// brokerKind is the broker FLOWLOG_TEST_KAFKA chooses, failing the test on
// a value it does not know.
func brokerKind(t testing.TB) string {
	t.Helper()
	kind, err := testenv.KafkaKind()
	if err != nil {
		t.Fatal(err)
	}
	return kind
}

// startBroker starts the broker FLOWLOG_TEST_KAFKA chooses with the apply
// topic of partitions partitions and the DDL and DLQ topics, its state
// in the test's temp dir, kept across Stop and Restart.
func startBroker(t testing.TB, partitions int) *broker {
	t.Helper()
	if brokerKind(t) == "kfake" {
		return startKfakeBroker(t, partitions)
	}
	// A benchmark's broker runs as in production (G1, C2).
	_, bench := t.(*testing.B)
	k := testenv.StartApacheKafka(t, testenv.ApacheKafkaConfig{ApplyPartitions: int32(partitions), Production: bench})
	return &broker{Addr: k.Addr, Kind: "apache", apache: k}
}

// startKfakeBroker starts a kfakebroker process whatever FLOWLOG_TEST_KAFKA
// says, for the tests that need kfake's fault injection (extra: its
// --nodes and --faults flags); its state persists in a data dir across
// Restart (add "--sync" to extra for state that also survives Kill).
func startKfakeBroker(t testing.TB, partitions int, extra ...string) *broker {
	t.Helper()
	args := []string{"--port", "0", "--apply-partitions", strconv.Itoa(partitions), "--data-dir", t.TempDir()}
	p := newProc(t, "kfakebroker", binary(t, "kfakebroker"), append(args, extra...)...)
	p.ready = waitForLine("kfake listening on ")
	p.Start()
	return &broker{Addr: p.Addr, Kind: "kfake", kfake: p}
}

// cpu is the broker process's user + system CPU seconds so far (0 if it
// cannot be read).
func (b *broker) cpu() float64 {
	if b.apache != nil {
		return pidCPU(b.apache.PID())
	}
	return restoreProcCPU(b.kfake)
}

// Kill kills the broker with SIGKILL and waits for its exit.
func (b *broker) Kill() {
	if b.apache != nil {
		b.apache.Kill()
		return
	}
	b.kfake.Kill()
}

// Stop stops the broker with SIGTERM and returns its exit error.
func (b *broker) Stop() error {
	if b.apache != nil {
		return b.apache.Stop()
	}
	return b.kfake.Stop()
}

// Restart kills the broker if it still runs and starts it again on the
// same address with the same data, failing the test otherwise.
func (b *broker) Restart(t testing.TB) {
	t.Helper()
	if b.apache != nil {
		b.apache.Kill()
		if err := b.apache.Start(); err != nil {
			t.Fatalf("restart Apache Kafka: %v", err)
		}
		b.Addr = b.apache.Addr
		return
	}
	b.kfake.Restart()
	b.Addr = b.kfake.Addr
}

// Signal sends sig to the broker process.
func (b *broker) Signal(sig syscall.Signal) {
	if b.apache != nil {
		b.apache.Signal(sig)
		return
	}
	b.kfake.Signal(sig)
}

// Log is what the broker printed.
func (b *broker) Log() string {
	if b.apache != nil {
		return readFile(b.apache.LogPath())
	}
	return b.kfake.Log()
}
