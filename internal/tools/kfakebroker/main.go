// Command kfakebroker runs franz-go's kfake Kafka broker as a process, for
// end-to-end tests that need to kill, restart or signal the broker
// independently of the test binary.
//
//	kfakebroker --port 0 --apply-partitions 4 [--data-dir DIR] [--nodes N] [--faults SPEC]
//
// When the broker accepts connections it prints exactly one line to stdout,
// "kfake listening on HOST:PORT", and it exits 0 on SIGTERM or SIGINT. With
// --data-dir the broker's state survives a restart of the process on the
// same directory (topics are seeded only when the directory holds no state).
//
// --faults injects retriable broker errors for fault-tolerance tests, e.g.
// "fetch=0.2,commit=0.3,produce=0.1,coordinator-move-every=5s,partition-move-every=5s":
// fetch and produce requests fail per partition with NOT_LEADER_FOR_PARTITION,
// offset commits with NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS, each
// with the given probability (the broker rejects a faulted request before
// acting on it), and coordinators and partition leaders move between the
// --nodes nodes periodically. The counts are printed on shutdown.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

// config is the command line of kfakebroker.
type config struct {
	port            int
	dataDir         string
	applyPartitions int
	applyTopic      string
	ddlTopic        string
	dlqTopic        string
	syncWrites      bool
	logLevel        string
	nodes           int
	faults          string
}

func (c *config) registerFlags(f *flag.FlagSet) {
	f.IntVar(&c.port, "port", 0, "port to listen on, on 127.0.0.1 (0: a free port)")
	f.StringVar(&c.dataDir, "data-dir", "", "directory to persist the broker's state in (empty: memory only)")
	f.IntVar(&c.applyPartitions, "apply-partitions", 4, "partitions of the apply topic")
	f.StringVar(&c.applyTopic, "apply-topic", "flowlog.apply", "apply topic to create")
	f.StringVar(&c.ddlTopic, "ddl-topic", "flowlog.ddl", "DDL topic to create (1 partition)")
	f.StringVar(&c.dlqTopic, "dlq-topic", "flowlog.dlq", "dead-letter topic to create (1 partition)")
	f.BoolVar(&c.syncWrites, "sync", false, "fsync every write (with --data-dir)")
	f.IntVar(&c.nodes, "nodes", 1, "broker nodes (the first on --port, the others on free ports)")
	f.StringVar(&c.faults, "faults", "", "retriable errors to inject, e.g. fetch=0.2,commit=0.3,produce=0.1,coordinator-move-every=5s,partition-move-every=5s")
	f.StringVar(&c.logLevel, "log-level", "none", "kfake log level to stderr: none, error, warn, info, debug")
}

func (c *config) validate() error {
	if c.port < 0 || c.port > 65535 {
		return fmt.Errorf("--port %d: out of range", c.port)
	}
	if c.applyPartitions < 1 {
		return fmt.Errorf("--apply-partitions %d: must be at least 1", c.applyPartitions)
	}
	if c.nodes < 1 {
		return fmt.Errorf("--nodes %d: must be at least 1", c.nodes)
	}
	if _, err := parseFaults(c.faults); err != nil {
		return err
	}
	if c.applyTopic == "" || c.ddlTopic == "" || c.dlqTopic == "" {
		return fmt.Errorf("topic names must not be empty")
	}
	return nil
}

func (c *config) opts() []kfake.Opt {
	level := kfake.LogLevelNone
	switch strings.ToLower(c.logLevel) {
	case "debug":
		level = kfake.LogLevelDebug
	case "info":
		level = kfake.LogLevelInfo
	case "warn":
		level = kfake.LogLevelWarn
	case "error":
		level = kfake.LogLevelError
	}
	opts := []kfake.Opt{
		kfake.Ports(append([]int{c.port}, make([]int, c.nodes-1)...)...),
		kfake.SeedTopics(int32(c.applyPartitions), c.applyTopic),
		kfake.SeedTopics(1, c.ddlTopic, c.dlqTopic),
		kfake.AllowAutoTopicCreation(),
		kfake.WithLogger(kfake.BasicLogger(os.Stderr, level)),
	}
	if c.dataDir != "" {
		opts = append(opts, kfake.DataDir(c.dataDir))
		if c.syncWrites {
			opts = append(opts, kfake.SyncWrites())
		}
	}
	return opts
}

func main() {
	var cfg config
	fs := flag.NewFlagSet("kfakebroker", flag.ExitOnError)
	cfg.registerFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "kfakebroker: %v\n", err)
		os.Exit(2)
	}

	// Subscribe before announcing readiness so a SIGTERM sent right after
	// the "listening" line is never lost.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)

	c, err := kfake.NewCluster(cfg.opts()...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kfakebroker: start: %v\n", err)
		os.Exit(1)
	}
	spec, _ := parseFaults(cfg.faults) // validated above
	stats, stopFaults := spec.install(c, []string{cfg.applyTopic, cfg.ddlTopic, cfg.dlqTopic},
		map[string]int32{cfg.applyTopic: int32(cfg.applyPartitions), cfg.ddlTopic: 1, cfg.dlqTopic: 1}, cfg.nodes)
	defer stopFaults()
	fmt.Printf("kfake listening on %s\n", c.ListenAddrs()[0])

	sig := <-sigs
	if cfg.faults != "" {
		fmt.Fprintf(os.Stderr, "kfakebroker: %v\n", stats)
	}
	fmt.Fprintf(os.Stderr, "kfakebroker: %v: shutting down\n", sig)
	done := make(chan struct{})
	go func() {
		c.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-sigs:
		fmt.Fprintln(os.Stderr, "kfakebroker: forced shutdown")
		os.Exit(1)
	}
}
