// Package deploy_test checks the container stack that cannot be started
// here: docker-compose.yml, the Dockerfile, the Prometheus configuration and
// alert rules, and the Grafana provisioning and dashboard. Everything that
// can be validated without a container engine is: the files parse, every
// referenced file exists, every image is pinned, the consumer's environment
// names real flags with valid values, and every metric a dashboard panel or
// an alert rule queries is one the code exports.
package deploy_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink/gcs"
)

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return v
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func asList(v any) []any         { l, _ := v.([]any); return l }
func asString(v any) string      { s, _ := v.(string); return s }

// composeServices returns docker-compose.yml's services.
func composeServices(t *testing.T) (map[string]any, map[string]any) {
	t.Helper()
	c := readYAML(t, "docker-compose.yml")
	svcs := asMap(c["services"])
	if len(svcs) == 0 {
		t.Fatal("docker-compose.yml: no services")
	}
	return c, svcs
}

// pinned reports whether an image reference names a fixed version: a digest,
// or a tag that is not "latest" and carries a version number.
func pinned(image string) bool {
	if _, digest, ok := strings.Cut(image, "@sha256:"); ok {
		return len(digest) == 64
	}
	slash := strings.LastIndex(image, "/")
	colon := strings.LastIndex(image, ":")
	if colon < slash+1 {
		return false
	}
	tag := image[colon+1:]
	return tag != "" && tag != "latest" && strings.ContainsAny(tag, "0123456789")
}

func TestPinned(t *testing.T) {
	for _, tc := range []struct {
		image string
		want  bool
	}{
		{"redis:7.4.2", true},
		{"prom/prometheus:v3.1.0", true},
		{"golang:1.26.8", true},
		{"redis", false},
		{"redis:latest", false},
		{"localhost:5000/redis", false},
		{"gcr.io/distroless/static-debian12:nonroot", false},
		{"redis@sha256:" + strings.Repeat("a", 64), true},
	} {
		t.Run(tc.image, func(t *testing.T) {
			if got := pinned(tc.image); got != tc.want {
				t.Errorf("pinned(%q) = %v, want %v", tc.image, got, tc.want)
			}
		})
	}
}

func TestComposeServicesAndImages(t *testing.T) {
	_, svcs := composeServices(t)
	for _, name := range []string{"kafka", "kafka-init", "redis", "gcs", "gcs-init", "consumer", "producer", "prometheus", "grafana"} {
		if svcs[name] == nil {
			t.Errorf("docker-compose.yml: no service %q", name)
		}
	}
	for name, v := range svcs {
		t.Run(name, func(t *testing.T) {
			svc := asMap(v)
			image := asString(svc["image"])
			if b := svc["build"]; b != nil {
				ctx := asString(b)
				dockerfile := "Dockerfile"
				if m := asMap(b); m != nil {
					ctx = asString(m["context"])
					if d := asString(m["dockerfile"]); d != "" {
						dockerfile = d
					}
				}
				if _, err := os.Stat(filepath.Join(repoRoot, ctx, dockerfile)); err != nil {
					t.Errorf("build context %q: %v", ctx, err)
				}
				return // a locally built image needs no registry pin
			}
			if !pinned(image) {
				t.Errorf("image %q is not pinned to a version", image)
			}
		})
	}
}

func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := map[string]bool{}
	var froms, users []string
	var entry string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			if !stages[f[1]] {
				froms = append(froms, f[1])
			}
			if len(f) >= 4 && strings.EqualFold(f[2], "AS") {
				stages[f[3]] = true
			}
		case "USER":
			users = append(users, f[1])
		case "ENTRYPOINT":
			entry = strings.Join(f[1:], " ")
		}
	}
	if len(froms) < 2 {
		t.Errorf("Dockerfile: want a multi-stage build, got FROM %v", froms)
	}
	for _, img := range froms {
		if !pinned(img) {
			t.Errorf("Dockerfile: FROM %s is not pinned to a version", img)
		}
	}
	if len(users) == 0 || strings.HasPrefix(users[len(users)-1], "root") || strings.HasPrefix(users[len(users)-1], "0") {
		t.Errorf("Dockerfile: the runtime image must run as a non-root USER, got %v", users)
	}
	if !strings.Contains(entry, "/consumer") {
		t.Errorf("Dockerfile: ENTRYPOINT %q is not the consumer", entry)
	}
	for _, want := range []string{"CGO_ENABLED=0", "./cmd/consumer", "./cmd/producer"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("Dockerfile: no %q", want)
		}
	}
}

// bindMounts returns a service's bind mounts as host path (relative to the
// repository) -> container path, and reports named volumes that the
// top-level volumes section does not declare.
func bindMounts(t *testing.T, compose map[string]any, svc map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range asList(svc["volumes"]) {
		var src, dst string
		if s, ok := v.(string); ok {
			parts := strings.Split(s, ":")
			if len(parts) < 2 {
				t.Errorf("volume %q: want source:target", s)
				continue
			}
			src, dst = parts[0], parts[1]
		} else {
			m := asMap(v)
			src, dst = asString(m["source"]), asString(m["target"])
		}
		if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
			out[src] = dst
			continue
		}
		if _, ok := asMap(compose["volumes"])[src]; !ok {
			t.Errorf("named volume %q is not declared under volumes:", src)
		}
	}
	return out
}

func TestComposeMountsExist(t *testing.T) {
	compose, svcs := composeServices(t)
	n := 0
	for name, v := range svcs {
		for src := range bindMounts(t, compose, asMap(v)) {
			n++
			if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
				t.Errorf("service %s mounts %s: %v", name, src, err)
			}
		}
	}
	if n == 0 {
		t.Error("no bind mounts found: the Prometheus and Grafana configuration should be mounted")
	}
}

// consumerFlags returns the flag set of `consumer run`: the exported
// configurations plus the flags cmd/consumer registers itself (found in its
// RegisterFlags methods).
func consumerFlags(t *testing.T) *flag.FlagSet {
	t.Helper()
	fs := flag.NewFlagSet("consumer run", flag.ContinueOnError)
	var (
		kc kafkaconf.Config
		mc meta.Config
		gc gcs.Config
		pc pipeline.Config
	)
	kc.RegisterFlags(fs)
	mc.RegisterFlags(fs)
	gc.RegisterFlags(fs)
	pc.RegisterFlags(fs)
	for _, name := range cmdFlagNames(t, "cmd/consumer/run.go", "cmd/consumer/conn.go") {
		if fs.Lookup(name) == nil {
			fs.String(name, "", "")
		}
	}
	return fs
}

var flagCallRE = regexp.MustCompile(`f\.\w+\(&c\.\w+, "([a-z0-9-]+)"`)

// cmdFlagNames returns the flags registered as f.XxxVar(&c.Field, "name", ...)
// in the given files of the main package.
func cmdFlagNames(t *testing.T, files ...string) []string {
	t.Helper()
	var names []string
	for _, file := range files {
		raw, err := os.ReadFile(filepath.Join(repoRoot, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flagCallRE.FindAllStringSubmatch(string(raw), -1) {
			names = append(names, m[1])
		}
	}
	for _, want := range []string{"group", "http-addr", "log-format", "redact-logs"} {
		if !slices.Contains(names, want) {
			t.Fatalf("flag --%s not found in %v (got %v)", want, files, names)
		}
	}
	return names
}

// envFlag maps FLOWLOG_FLUSH_SIZE to flush-size.
func envFlag(env string) (string, bool) {
	rest, ok := strings.CutPrefix(env, "FLOWLOG_")
	return strings.ToLower(strings.ReplaceAll(rest, "_", "-")), ok
}

func TestComposeConsumer(t *testing.T) {
	_, svcs := composeServices(t)
	svc := asMap(svcs["consumer"])
	if r, _ := asMap(svc["deploy"])["replicas"].(int); r != 2 {
		t.Errorf("consumer deploy.replicas = %v, want 2", asMap(svc["deploy"])["replicas"])
	}
	fs := consumerFlags(t)
	env := asMap(svc["environment"])
	for k, v := range env {
		name, ok := envFlag(k)
		if !ok {
			continue
		}
		if fs.Lookup(name) == nil {
			t.Errorf("consumer env %s: consumer run has no flag --%s", k, name)
			continue
		}
		if err := fs.Set(name, strings.TrimSpace(asString(v)+anyScalar(v))); err != nil {
			t.Errorf("consumer env %s=%v: %v", k, v, err)
		}
	}
	// Every setting is spelled out, except those whose default is right
	// for the stack: --store-id (the container hostname, unique per replica)
	// the TLS/SASL credentials of a plaintext broker, the admin token
	// (unset: POST /flush only from inside the container) and the KMS key
	// (the emulator has no KMS).
	optional := map[string]bool{"store-id": true, "kafka-tls-ca": true, "kafka-tls-cert": true,
		"kafka-tls-key": true, "kafka-sasl-user": true, "kafka-sasl-password": true,
		"kafka-sasl-allow-plaintext": true, "admin-token": true, "admin-token-file": true,
		"gcs-kms-key": true}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := env["FLOWLOG_"+strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))]; !ok && !optional[f.Name] {
			t.Errorf("consumer env: no FLOWLOG_ variable for --%s", f.Name)
		}
	})
	if got := fs.Lookup("http-addr").Value.String(); !strings.HasPrefix(got, "0.0.0.0:") {
		t.Errorf("consumer --http-addr %q: Prometheus in another container cannot reach it", got)
	}
	if fs.Lookup("gcs-endpoint").Value.String() == "" {
		t.Error("consumer: FLOWLOG_GCS_ENDPOINT must point at the emulator")
	}
}

// anyScalar renders YAML numbers and booleans (strings render as "").
func anyScalar(v any) string {
	switch v.(type) {
	case string, nil:
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func TestComposeProducerAndTopics(t *testing.T) {
	_, svcs := composeServices(t)
	var kc kafkaconf.Config
	fs := flag.NewFlagSet("producer", flag.ContinueOnError)
	kc.RegisterFlags(fs)
	prod := asMap(svcs["producer"])
	for k := range asMap(prod["environment"]) {
		if name, ok := envFlag(k); ok && fs.Lookup(name) == nil {
			t.Errorf("producer env %s: no Kafka flag --%s", k, name)
		}
	}
	cmd := commandText(prod)
	for _, want := range []string{"/producer flow create --name demo", "/producer load "} {
		if !strings.Contains(cmd, want) {
			t.Errorf("producer command lacks %q:\n%s", want, cmd)
		}
	}
	initCmd := commandText(asMap(svcs["kafka-init"]))
	for _, tc := range []struct{ topic, partitions string }{
		{"flowlog.apply", "8"}, {"flowlog.ddl", "1"}, {"flowlog.dlq", "1"},
	} {
		re := regexp.MustCompile(`--create --if-not-exists --topic ` + regexp.QuoteMeta(tc.topic) + ` --partitions (\d+)`)
		m := re.FindStringSubmatch(initCmd)
		if m == nil || m[1] != tc.partitions {
			t.Errorf("kafka-init does not create %s with %s partitions", tc.topic, tc.partitions)
		}
	}
}

func commandText(svc map[string]any) string {
	var parts []string
	for _, k := range []string{"entrypoint", "command"} {
		switch v := svc[k].(type) {
		case string:
			parts = append(parts, v)
		case []any:
			for _, p := range v {
				parts = append(parts, asString(p))
			}
		}
	}
	return strings.Join(parts, " ")
}
