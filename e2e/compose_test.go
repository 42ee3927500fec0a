package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink/gcs"
)

// composeFile is the parts of docker-compose.yml the native run reads.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Deploy      struct {
		Replicas int `yaml:"replicas"`
	} `yaml:"deploy"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// composeNative maps the compose stack's names onto this machine: host
// names and ports to the loopback addresses of the processes that play the
// services, the image's paths (/consumer, /producer, /opt/kafka/bin, the
// temp dir) to the built binaries and to shims.
type composeNative struct {
	hosts *strings.Replacer
	env   map[string]string // the image's ENV (Dockerfile), under the service's own
	entry []string          // the image's ENTRYPOINT
}

// run runs a compose command (exec form, or a CMD-SHELL / sh -c script)
// with env to completion within timeout and returns its combined output.
func (n *composeNative) run(timeout time.Duration, env map[string]string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = n.environ(env)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// environ is the process environment of a service: PATH and HOME of the
// test, then the image's and the service's variables, mapped.
func (n *composeNative) environ(env map[string]string) []string {
	out := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for _, m := range []map[string]string{n.env, env} {
		for k, v := range m {
			out = append(out, k+"="+n.hosts.Replace(v))
		}
	}
	return out
}

// script is a compose command list ([/bin/sh -c, script] or its command
// part) with compose's $$ unescaped and names mapped.
func (n *composeNative) script(s string) string {
	return n.hosts.Replace(strings.ReplaceAll(s, "$$", "$"))
}

// healthcheck is a health check test turned into a command line.
func (n *composeNative) healthcheck(test []string, extra ...string) []string {
	switch test[0] {
	case "CMD-SHELL":
		return []string{"/bin/sh", "-c", n.script(test[1])}
	case "CMD":
		argv := append([]string{}, test[1:]...)
		for i := range argv {
			argv[i] = n.hosts.Replace(argv[i])
		}
		return append(argv[:1], append(extra, argv[1:]...)...)
	}
	return test
}

// dockerfile returns the ENV and the ENTRYPOINT of the final stage of the
// repository's Dockerfile (the image every flowlog service runs).
func dockerfile(t *testing.T) (map[string]string, []string) {
	t.Helper()
	env := map[string]string{}
	var entry []string
	lines := strings.Split(strings.ReplaceAll(string(repoFile(t, "Dockerfile")), "\\\n", " "), "\n")
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "FROM":
			env, entry = map[string]string{}, nil
		case "ENV":
			for _, kv := range f[1:] {
				if k, v, ok := strings.Cut(kv, "="); ok {
					env[k] = v
				}
			}
		case "ENTRYPOINT":
			if err := yaml.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "ENTRYPOINT")), &entry); err != nil {
				t.Fatalf("Dockerfile ENTRYPOINT: %v", err)
			}
		}
	}
	if len(entry) == 0 {
		t.Fatal("Dockerfile: no ENTRYPOINT")
	}
	return env, entry
}

// kafkaShims writes the Kafka distribution scripts the compose file runs
// (/opt/kafka/bin/*.sh) as scripts that run the same tool classes from the
// test broker's classpath.
func kafkaShims(t *testing.T) string {
	t.Helper()
	jars, err := testenv.ApacheKafkaJars()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for script, class := range map[string]string{
		"kafka-topics.sh":              "org.apache.kafka.tools.TopicCommand",
		"kafka-broker-api-versions.sh": "org.apache.kafka.tools.BrokerApiVersionsCommand",
	} {
		sh := fmt.Sprintf("#!/bin/sh\nexec java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp '%s' %s \"$@\"\n", jars, class)
		if err := os.WriteFile(filepath.Join(dir, script), []byte(sh), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestComposeNative runs docker-compose.yml's stack as native processes:
// Apache Kafka (the image's version), redis-server, the GCS emulator and a
// Pushgateway, the kafka-init and gcs-init jobs' own scripts, each consumer
// replica with exactly the environment and command the file gives it
// (after the image's ENV and ENTRYPOINT), the producer job's flow create,
// and the retention job's script. Only names are mapped: host names and
// ports to loopback addresses, the image's paths to the built binaries,
// and each replica's hostname (its default --store-id) to its own name.
// Every health check of the file passes against the running processes,
// with its own command, and the flow the producer job creates is backed
// up.
func TestComposeNative(t *testing.T) {
	var cf composeFile
	if err := yaml.Unmarshal(repoFile(t, "docker-compose.yml"), &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	svc := func(name string) composeService {
		s, ok := cf.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml: no service %s", name)
		}
		return s
	}
	k := testenv.StartApacheKafka(t, testenv.ApacheKafkaConfig{Topics: []testenv.TopicSpec{}})
	rds := testenv.StartRedis(t)
	g := startGCS(t)
	pg := startPushgateway(t)
	imgEnv, entry := dockerfile(t)
	shims := kafkaShims(t)
	bins := map[string]string{"/consumer": binary(t, "consumer"), "/producer": binary(t, "producer")}
	n := &composeNative{env: imgEnv, entry: entry}
	imageTemp := filepath.Join(t.TempDir(), "temp") // the image has /var/lib/flowlog/temp
	if err := os.MkdirAll(imageTemp, 0o755); err != nil {
		t.Fatal(err)
	}
	n.hosts = strings.NewReplacer(
		"kafka:9092", k.Addr, "localhost:9092", k.Addr, "redis:6379", rds.Addr, "gcs:4443", g.Addr,
		"pushgateway:9091", pg.Addr, "/opt/kafka/bin/", shims+"/",
		"/consumer ", bins["/consumer"]+" ", "/producer ", bins["/producer"]+" ",
		"/var/lib/flowlog/temp", imageTemp)

	// The broker's health check, then the init jobs.
	kafka := svc("kafka")
	waitFor(t, time.Minute, func() (bool, string) {
		out, err := n.run(time.Minute, nil, n.healthcheck(kafka.Healthcheck.Test)...)
		return err == nil, fmt.Sprintf("kafka health check: %v\n%s", err, out)
	})
	for _, job := range []string{"kafka-init", "gcs-init"} {
		s := svc(job)
		argv := append(append([]string{}, s.Entrypoint...), n.script(strings.Join(s.Command, "\n")))
		if out, err := n.run(3*time.Minute, s.Environment, argv...); err != nil {
			t.Fatalf("%s: %v\n%s", job, err, out)
		}
	}
	checkComposeTopics(t, k.Addr)
	redisHC := svc("redis").Healthcheck.Test
	if out, err := n.run(10*time.Second, nil, n.healthcheck(redisHC, "-h", "127.0.0.1", "-p", portOf(rds.Addr))...); err != nil || strings.TrimSpace(out) != "PONG" {
		t.Fatalf("redis health check %v: %v %q", redisHC, err, out)
	}

	// The consumer replicas: the image's ENTRYPOINT and the service's
	// command, the image's ENV and the service's environment.
	cons := svc("consumer")
	if cons.Deploy.Replicas < 1 {
		t.Fatal("consumer: no replicas")
	}
	var replicas []*proc
	for i := 1; i <= cons.Deploy.Replicas; i++ {
		name := fmt.Sprintf("consumer-%d", i)
		addr := freeAddr(t)
		// Each container has its own network namespace and hostname.
		local := strings.NewReplacer("0.0.0.0:8080", addr, "127.0.0.1:8080", addr)
		env := map[string]string{}
		for k, v := range cons.Environment {
			env[k] = local.Replace(v)
		}
		ne := &composeNative{hosts: n.hosts, env: map[string]string{}, entry: entry}
		for k, v := range imgEnv {
			ne.env[k] = local.Replace(v)
		}
		env["FLOWLOG_STORE_ID"] = name // the container hostname
		env["FLOWLOG_TEMP_DIR"] = filepath.Join(t.TempDir(), name)
		argv := append(append([]string{}, entry...), cons.Command...)
		argv[0] = bins[argv[0]]
		p := newProc(t, name, argv[0], argv[1:]...)
		p.env = ne.environ(env)
		hc := ne.healthcheck(cons.Healthcheck.Test)
		for i := range hc {
			hc[i] = local.Replace(hc[i])
		}
		p.ready = func(p *proc, _ int64) error {
			deadline := time.Now().Add(2 * time.Minute)
			for {
				out, err := ne.run(10*time.Second, nil, hc...)
				switch {
				case err == nil:
					p.Addr = addr
					return nil
				case p.hasExited():
					return fmt.Errorf("exited before its health check passed: %v", p.Wait())
				case time.Now().After(deadline):
					return fmt.Errorf("health check %v: %v %s", hc, err, out)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		p.Start()
		replicas = append(replicas, p)
	}

	// The producer job's flow create, as written; its load with fewer
	// events, no rate limit and a start time.
	prod := svc("producer")
	var cfg loadgen.Config
	flow, tables := "", ""
	for _, line := range strings.Split(strings.Join(prod.Command, "\n"), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "/producer flow create"):
			args := strings.Fields(n.script(line))
			flow, tables = flagValue(args, "--name"), flagValue(args, "--tables")
			if out, err := n.run(2*time.Minute, prod.Environment, "/bin/sh", "-c", n.script(line)); err != nil {
				t.Fatalf("producer job %q: %v\n%s", line, err, out)
			}
		case strings.HasPrefix(line, "/producer load"):
			args := strings.Fields(line)[2:]
			setFlag(args, "--events", "20000")
			setFlag(args, "--rate", "0")
			// A fixed start, so that the expected events can be computed
			// here (by default the load starts now), an hour ago so that
			// the retention job's truncate finds the snapshot old enough.
			args = append(args, "--start-time", time.Now().Add(-time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339))
			fs := flag.NewFlagSet("load", flag.ContinueOnError)
			cfg.RegisterFlags(fs)
			fs.Float64("rate", 0, "")
			if err := fs.Parse(args); err != nil {
				t.Fatalf("producer job load %q: %v", line, err)
			}
			argv := append([]string{bins["/producer"], "load"}, args...)
			if out, err := n.run(2*time.Minute, prod.Environment, argv...); err != nil {
				t.Fatalf("producer load: %v\n%s", err, out)
			}
		}
	}
	if flow == "" || cfg.Events == 0 {
		t.Fatalf("producer job: no flow create (%q) or load (%+v)", flow, cfg)
	}
	want := expectedEvents(cfg, tableSet(t, tables))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	store := meta.NewStore(rds.Client(t), cons.Environment["FLOWLOG_REDIS_PREFIX"], nil)
	id := waitFlowCheckpoint(ctx, t, store, flow, want.maxResolved, 3*time.Minute)
	bucket, err := gcs.New(ctx, gcs.Config{Bucket: cons.Environment["FLOWLOG_GCS_BUCKET"], Endpoint: g.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	got := readFlowBackup(ctx, t, store, bucket, id)
	if got.entries != want.total {
		t.Errorf("flow %s: %d entries backed up, %d expected", flow, got.entries, want.total)
	}
	for key, c := range want.events {
		if got.events[key] != c {
			t.Fatalf("flow %s: %s stored %d times, want %d", flow, key, got.events[key], c)
		}
	}
	for _, p := range replicas {
		if !p.Running() {
			t.Fatalf("%s exited: %v", p.name, p.Wait())
		}
	}

	// The retention job's first round pushes snapshot, truncate and gc;
	// it keeps one second of log instead of a day, so that its truncate
	// has a snapshot old enough.
	ret := svc("retention")
	rp := newProc(t, "retention", ret.Entrypoint[0], append(ret.Entrypoint[1:], n.script(strings.Join(ret.Command, "\n")))...)
	ret.Environment["FLOWLOG_RETENTION_KEEP"] = "1s"
	rp.env = n.environ(ret.Environment)
	rp.Start()
	waitFor(t, 3*time.Minute, func() (bool, string) {
		body, err := httpGet("http://" + pg.Addr + "/metrics")
		var missing []string
		for _, c := range []string{"snapshot", "truncate", "gc"} {
			if !regexp.MustCompile(`flowlog_op_last_success_timestamp_seconds\{command="` + c + `"[^}]*\} [1-9]`).MatchString(body) {
				missing = append(missing, c)
			}
		}
		return err == nil && len(missing) == 0, fmt.Sprintf("no successful %v pushed yet (%v)\n%s", missing, err, rp.logTail(4<<10))
	})
	rp.Kill()
	if log := rp.Log(); regexp.MustCompile(`(?m)^retention: `).MatchString(log) {
		t.Errorf("retention job reported a failure:\n%s", log)
	}
	for _, p := range replicas {
		if err := p.Stop(); err != nil {
			t.Errorf("%s exit after SIGTERM: %v", p.name, err)
		}
	}
	t.Logf("compose stack natively: %d replicas healthy, flow %s backed up (%d entries), retention pushed", len(replicas), flow, got.entries)
}

// checkComposeTopics: the topics kafka-init created are testenv's
// ComposeTopics, partitions and retention alike, so the tests' brokers
// have the stack's topics.
func checkComposeTopics(t *testing.T, brokers string) {
	t.Helper()
	adm := newAdmin(t, brokers)
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	apply := int32(len(td[testenv.ApplyTopic].Partitions))
	if apply == 0 {
		t.Fatalf("kafka-init created no %s", testenv.ApplyTopic)
	}
	if err := testenv.VerifyTopics(ctx, brokers, testenv.ComposeTopics(apply)); err != nil {
		t.Errorf("kafka-init against testenv.ComposeTopics: %v", err)
	}
}

// flagValue is the value after name in args, "" if absent.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return strings.Trim(args[i+1], `"`)
		}
	}
	return ""
}

// setFlag replaces the value after name in args.
func setFlag(args []string, name, value string) {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			args[i+1] = value
		}
	}
}

// tableSet parses a --tables list.
func tableSet(t *testing.T, list string) map[int64]bool {
	t.Helper()
	out := map[int64]bool{}
	for _, s := range strings.Split(list, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			t.Fatalf("--tables %q: %v", list, err)
		}
		out[id] = true
	}
	return out
}

func portOf(addr string) string {
	_, port, _ := strings.Cut(addr, ":")
	return port
}

// httpGet returns the body of a GET.
func httpGet(url string) (string, error) {
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b.String(), err
}
