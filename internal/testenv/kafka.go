package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Default topic names, matching the consumer's flag defaults.
const (
	ApplyTopic = "flowlog.apply"
	DDLTopic   = "flowlog.ddl"
	DLQTopic   = "flowlog.dlq"
)

// Kafka is an in-process kfake cluster: a real Kafka protocol server on
// loopback ports.
type Kafka struct {
	*kfake.Cluster
}

// StartKafka starts a one-broker kfake cluster with the apply topic
// (applyPartitions partitions), the DDL topic (1 partition) and the DLQ topic
// (1 partition) created. Extra kfake options are appended.
func StartKafka(t testing.TB, applyPartitions int32, opts ...kfake.Opt) *Kafka {
	t.Helper()
	base := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(applyPartitions, ApplyTopic),
		kfake.SeedTopics(1, DDLTopic, DLQTopic),
	}
	c, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &Kafka{c}
}

// Brokers is the comma-separated seed list, as the --brokers flag takes it.
func (k *Kafka) Brokers() string { return strings.Join(k.ListenAddrs(), ",") }

// Client returns a franz-go client for this cluster with opts appended,
// closed when the test ends.
func (k *Kafka) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.ListenAddrs()...)}, opts...)...)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// KafkaKindEnv is the variable that chooses the broker end-to-end tests run
// on: "apache" (the default: Apache Kafka, StartApacheKafka) or "kfake"
// (franz-go's in-process stand-in, faster and with fault injection).
const KafkaKindEnv = "FLOWLOG_TEST_KAFKA"

// KafkaKind returns the broker FLOWLOG_TEST_KAFKA chooses, "apache" or
// "kfake"; any other value is an error.
func KafkaKind() (string, error) {
	switch v := os.Getenv(KafkaKindEnv); v {
	case "", "apache":
		return "apache", nil
	case "kfake":
		return "kfake", nil
	default:
		return "", fmt.Errorf("%s=%q: want apache or kfake", KafkaKindEnv, v)
	}
}
