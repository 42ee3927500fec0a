package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ApacheKafka is an Apache Kafka broker process owned by one test: one
// node in KRaft mode that is broker and controller at once (the compose
// file's kafka service), on free loopback ports, with its log dirs in the
// test's temp dir.
//
// The process is stopped by its PID when the test ends, and it is started
// with the parent-death signal set to SIGKILL, so a test binary that
// panics, times out or is killed never leaves a JVM behind.
type ApacheKafka struct {
	// Addr is the host:port of the PLAINTEXT listener, for --brokers.
	Addr string

	cfg        ApacheKafkaConfig
	dir        string
	controller string // host:port of the CONTROLLER listener
	logPath    string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	err  error         // cmd.Wait's result, valid after done
}

// ApacheKafkaConfig is what StartApacheKafka sets up. The zero value is a
// broker with the compose file's three topics, the apply topic with 4
// partitions.
type ApacheKafkaConfig struct {
	// ApplyPartitions is the apply topic's partition count (0: 4).
	ApplyPartitions int32
	// Topics are the topics created once the broker answers; nil: the
	// compose file's (ComposeTopics(ApplyPartitions)).
	Topics []TopicSpec
	// Props are server.properties entries added to or replacing the
	// defaults, e.g. "message.max.bytes": "2097152".
	Props map[string]string
	// HeapMB is the JVM's -Xmx in MiB (0: 512).
	HeapMB int
	// Production runs the JVM as kafka-server-start.sh does (G1, hot code
	// compiled by C2), for benchmarks. Off, it uses the serial collector
	// and stops at the C1 compiler, which starts a broker in about half
	// the CPU time; tests move too little data for it to matter.
	Production bool
}

// TopicSpec is one topic to create.
type TopicSpec struct {
	Name       string
	Partitions int32
	Configs    map[string]string
}

// ComposeTopics are the topics the compose file's kafka-init job creates:
// the apply topic with applyPartitions partitions and the DDL and DLQ
// topics with one each, with the retention docker-compose.yml gives them.
// deploy/compose_native_test.go runs that job's own script against a
// broker, so the two cannot drift.
func ComposeTopics(applyPartitions int32) []TopicSpec {
	return []TopicSpec{
		{Name: ApplyTopic, Partitions: applyPartitions, Configs: map[string]string{"retention.ms": "604800000"}},
		{Name: DDLTopic, Partitions: 1, Configs: map[string]string{"retention.ms": "-1"}},
		{Name: DLQTopic, Partitions: 1, Configs: map[string]string{"retention.ms": "2592000000"}},
	}
}

// clusterID is the KRaft cluster id every test broker is formatted with
// (the compose file's CLUSTER_ID).
const clusterID = "4L6g3nShT-eMCtK--X86sw"

// StartApacheKafka formats a fresh KRaft log dir, starts kafka.Kafka on
// free loopback ports, waits until it answers and creates cfg's topics. It
// fails the test if Java or the broker's jars are missing (ApacheKafkaJars
// fetches them with Maven on first use).
func StartApacheKafka(t testing.TB, cfg ApacheKafkaConfig) *ApacheKafka {
	t.Helper()
	if cfg.ApplyPartitions == 0 {
		cfg.ApplyPartitions = 4
	}
	if cfg.Topics == nil {
		cfg.Topics = ComposeTopics(cfg.ApplyPartitions)
	}
	if cfg.HeapMB == 0 {
		cfg.HeapMB = 512
	}
	k := takeSpare(cfg)
	if k == nil {
		var err error
		if k, err = launch(cfg, t.TempDir()); err != nil {
			t.Fatalf("start Apache Kafka: %v", err)
		}
	} else {
		t.Cleanup(func() { _ = os.RemoveAll(k.dir) })
	}
	t.Cleanup(func() {
		k.Kill()
		if t.Failed() {
			t.Logf("--- log of the Apache Kafka broker (%s):\n%s", k.logPath, tail(k.logPath, 32<<10))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.CreateTopics(ctx, cfg.Topics...); err != nil {
		t.Fatalf("Apache Kafka: %v", err)
	}
	return k
}

// launch starts a broker of cfg with its files in dir, retrying with new
// ports when one was taken between FreePort and the JVM's bind.
func launch(cfg ApacheKafkaConfig, dir string) (*ApacheKafka, error) {
	k := &ApacheKafka{cfg: cfg, dir: dir, logPath: filepath.Join(dir, "kafka.log")}
	var err error
	for range 3 {
		if err = k.configure(); err == nil {
			if err = k.Start(); err == nil {
				return k, nil
			}
		}
		k.Kill()
	}
	return nil, err
}

// Start starts the broker process (again, after Stop or Kill: same ports,
// same data) and waits until it answers a metadata request.
func (k *ApacheKafka) Start() error {
	k.mu.Lock()
	if k.cmd != nil && !k.exited() {
		k.mu.Unlock()
		return errors.New("apache kafka: already running")
	}
	log, err := os.OpenFile(k.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		k.mu.Unlock()
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "=== %s: start kafka.Kafka on %s\n", time.Now().Format(time.RFC3339Nano), k.Addr)
	cmd, err := k.java(context.Background(), "kafka.Kafka", filepath.Join(k.dir, "server.properties"))
	if err != nil {
		k.mu.Unlock()
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		k.mu.Unlock()
		return fmt.Errorf("exec java: %w", err)
	}
	done := make(chan struct{})
	k.cmd, k.done = cmd, done
	k.mu.Unlock()
	go func() {
		err := cmd.Wait()
		k.mu.Lock()
		k.err = err
		k.mu.Unlock()
		close(done)
	}()
	return k.waitReady(2 * time.Minute)
}

// waitReady polls the broker until a metadata request lists it, or the
// process exits, or timeout passes.
func (k *ApacheKafka) waitReady(timeout time.Duration) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addr), kgo.RetryTimeout(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if !k.Running() {
			return fmt.Errorf("kafka.Kafka exited before it answered: %v\n%s", k.Wait(), tail(k.logPath, 8<<10))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m, err := adm.BrokerMetadata(ctx)
		cancel()
		if err == nil && len(m.Brokers) > 0 {
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kafka.Kafka on %s did not answer within %v: %v", k.Addr, timeout, last)
}

// PID is the broker's process id, 0 when it is not running.
func (k *ApacheKafka) PID() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cmd == nil || k.exited() {
		return 0
	}
	return k.cmd.Process.Pid
}

// Running reports whether the broker process is running.
func (k *ApacheKafka) Running() bool { return k.PID() != 0 }

// Stop sends SIGTERM (a controlled shutdown) and waits for the exit,
// killing the broker after 30 seconds; it returns the exit error. The JVM's
// exit status after its shutdown hooks ran on SIGTERM, 143, is a clean
// stop.
func (k *ApacheKafka) Stop() error {
	k.signal(syscall.SIGTERM)
	t := time.AfterFunc(30*time.Second, k.Kill)
	defer t.Stop()
	err := k.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 128+int(syscall.SIGTERM) {
		return nil
	}
	return err
}

// Kill sends SIGKILL to the broker (and anything it started; a frozen one
// too) and waits for the exit. It is safe to call more than once.
func (k *ApacheKafka) Kill() {
	k.signal(syscall.SIGKILL)
	k.signal(syscall.SIGCONT)
	_ = k.Wait()
}

// Signal sends sig to the broker's process group, if it is running:
// SIGSTOP freezes the broker (it stops answering, connections stay open)
// until SIGCONT.
func (k *ApacheKafka) Signal(sig syscall.Signal) { k.signal(sig) }

func (k *ApacheKafka) signal(sig syscall.Signal) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cmd != nil && !k.exited() {
		signalGroup(k.cmd.Process.Pid, sig)
	}
}

// Wait waits for the broker process to exit and returns its exit error.
func (k *ApacheKafka) Wait() error {
	k.mu.Lock()
	done := k.done
	k.mu.Unlock()
	if done == nil {
		return nil
	}
	<-done
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// exited reports whether the current process has been waited for; k.mu held.
func (k *ApacheKafka) exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// LogPath is the file the broker's stdout and stderr go to.
func (k *ApacheKafka) LogPath() string { return k.logPath }

// Client returns a franz-go client for this broker with opts appended,
// closed when the test ends.
func (k *ApacheKafka) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Addr)}, opts...)...)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int64) string {
	b, _ := os.ReadFile(path)
	if int64(len(b)) > n {
		b = append([]byte("...\n"), b[int64(len(b))-n:]...)
	}
	return string(b)
}
