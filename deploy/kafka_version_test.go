package deploy_test

import (
	"strings"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestKafkaVersionMatchesTests: the compose stack's apache/kafka image is
// the Kafka version the tests run (internal/testenv/kafka/pom.xml), so what
// CI proved is what the stack starts.
func TestKafkaVersionMatchesTests(t *testing.T) {
	want, err := testenv.ApacheKafkaVersion()
	if err != nil {
		t.Fatal(err)
	}
	_, svcs := composeServices(t)
	n := 0
	for name, s := range svcs {
		image := asString(asMap(s)["image"])
		repo, tag, _ := strings.Cut(image, ":")
		if repo != "apache/kafka" {
			continue
		}
		n++
		if tag != want {
			t.Errorf("service %s runs %s; the tests run Apache Kafka %s (internal/testenv/kafka/pom.xml): keep them equal", name, image, want)
		}
	}
	if n == 0 {
		t.Fatal("docker-compose.yml: no service runs apache/kafka")
	}
}
