package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// configure picks ports and writes server.properties and the log4j2
// config; it formats the log dir the first time.
func (k *ApacheKafka) configure() error {
	ports := [2]int{}
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return fmt.Errorf("free port: %w", err)
		}
		ports[i] = p
	}
	k.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	k.controller = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	props := map[string]string{
		"process.roles":                            "broker,controller",
		"node.id":                                  "1",
		"controller.quorum.voters":                 "1@" + k.controller,
		"listeners":                                "PLAINTEXT://" + k.Addr + ",CONTROLLER://" + k.controller,
		"advertised.listeners":                     "PLAINTEXT://" + k.Addr,
		"listener.security.protocol.map":           "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
		"controller.listener.names":                "CONTROLLER",
		"inter.broker.listener.name":               "PLAINTEXT",
		"log.dirs":                                 filepath.Join(k.dir, "data"),
		"auto.create.topics.enable":                "false",
		"offsets.topic.replication.factor":         "1",
		"transaction.state.log.replication.factor": "1",
		"transaction.state.log.min.isr":            "1",
		"group.initial.rebalance.delay.ms":         "0",
		// One offsets partition instead of 50: the group coordinator is up
		// in well under a second, which every test's first join waits for.
		"offsets.topic.num.partitions":                     "1",
		"share.coordinator.state.topic.replication.factor": "1",
		"share.coordinator.state.topic.min.isr":            "1",
	}
	for key, v := range k.cfg.Props {
		props[key] = v
	}
	keys := make([]string, 0, len(props))
	for key := range props {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, key := range keys {
		fmt.Fprintf(&b, "%s=%s\n", key, props[key])
	}
	if err := os.WriteFile(filepath.Join(k.dir, "server.properties"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(k.dir, "log4j2.properties"), []byte(log4j2Config), 0o644); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(k.dir, "data", "meta.properties")); err == nil {
		return nil
	}
	tmpl, err := formatted()
	if err != nil {
		return err
	}
	return os.CopyFS(filepath.Join(k.dir, "data"), os.DirFS(tmpl))
}

var formatTemplate struct {
	once sync.Once
	dir  string
	err  error
}

// formatted returns a KRaft log dir formatted by kafka.tools.StorageTool
// for node 1 of clusterID: each broker starts from a copy, which saves a
// JVM run per broker (the listeners are not part of what the format
// writes). It is made once per Kafka version, next to the jars.
func formatted() (string, error) {
	formatTemplate.once.Do(func() {
		formatTemplate.dir, formatTemplate.err = format()
	})
	return formatTemplate.dir, formatTemplate.err
}

func format() (string, error) {
	v, err := ApacheKafkaVersion()
	if err != nil {
		return "", err
	}
	final := filepath.Join(filepath.Dir(kafkaPOM()), "target", "kraft-format-"+v)
	if _, err := os.Stat(filepath.Join(final, "meta.properties")); err == nil {
		return final, nil
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(filepath.Dir(final), ".kraft-format-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	k := &ApacheKafka{cfg: ApacheKafkaConfig{HeapMB: 256}, dir: dir}
	props := "process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:9093\n" +
		"controller.listener.names=CONTROLLER\nlisteners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093\n" +
		"log.dirs=" + filepath.Join(dir, "data") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "server.properties"), []byte(props), 0o644); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, err := k.java(ctx, "kafka.tools.StorageTool", "format", "-t", clusterID,
		"-c", filepath.Join(dir, "server.properties"))
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("format the KRaft log dir: %w\n%s", err, out)
	}
	// Another test binary may have won the race: its copy is as good.
	if err := os.Rename(filepath.Join(dir, "data"), final); err != nil {
		if _, serr := os.Stat(filepath.Join(final, "meta.properties")); serr != nil {
			return "", fmt.Errorf("keep the formatted KRaft log dir: %w", err)
		}
	}
	return final, nil
}

// log4j2Config logs warnings and the broker's start and stop to the
// broker's log file (stdout), not the per-topic state-change chatter.
const log4j2Config = `status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
`

// java returns a command that runs main with the broker's classpath and a
// small heap.
func (k *ApacheKafka) java(ctx context.Context, main string, args ...string) (*exec.Cmd, error) {
	jars, err := ApacheKafkaJars()
	if err != nil {
		return nil, err
	}
	heap := k.cfg.HeapMB
	if heap == 0 {
		heap = 512
	}
	jvm := []string{"-Xmx" + strconv.Itoa(heap) + "m", "-Xms" + strconv.Itoa(min(heap, 128)) + "m"}
	if k.cfg.Production {
		jvm = append(jvm, "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
			"-XX:+ExplicitGCInvokesConcurrent")
	} else {
		jvm = append(jvm, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
	}
	jvm = append(jvm, "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile="+filepath.Join(k.dir, "log4j2.properties"),
		"-cp", jars, main)
	cmd := exec.CommandContext(ctx, javaBin(), append(jvm, args...)...)
	cmd.SysProcAttr = childAttr()
	return cmd, nil
}
