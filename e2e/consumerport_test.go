package e2e

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// A consumer whose picked port is taken by another process (here one that
// answers /healthz like a consumer) is started again on another port, and
// the test gets the consumer, not the other process.
func TestStartConsumerRetriesATakenPort(t *testing.T) {
	c := startCluster(t, 1)
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "not the consumer")
	})}
	go func() { _ = srv.Serve(other) }()
	defer srv.Close()
	taken := other.Addr().(*net.TCPAddr).Port

	picks := 0
	pick := consumerPort
	consumerPort = func() (int, error) {
		if picks++; picks == 1 {
			return taken, nil
		}
		return pick()
	}
	defer func() { consumerPort = pick }()

	cons := c.startConsumer(t, "consumer-retry")
	if picks < 2 {
		t.Fatalf("%d ports picked, want a second after the taken one", picks)
	}
	if cons.Addr == net.JoinHostPort("127.0.0.1", strconv.Itoa(taken)) {
		t.Fatalf("consumer address %s is the taken port's", cons.Addr)
	}
	resp, err := http.Get("http://" + cons.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "\nflowlog_") {
		t.Fatalf("GET /metrics on %s: %s, %d bytes without flowlog metrics", cons.Addr, resp.Status, len(body))
	}
}
