package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// kafkaPOM is the Maven project whose dependencies are the broker's
// classpath, next to this file.
func kafkaPOM() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "kafka", "pom.xml")
}

var kafkaVersionRE = regexp.MustCompile(`<kafka\.version>([^<]+)</kafka\.version>`)

// ApacheKafkaVersion is the Kafka version internal/testenv/kafka/pom.xml
// pins (the compose file's apache/kafka image tag: deploy's tests check
// that the two are equal).
func ApacheKafkaVersion() (string, error) {
	b, err := os.ReadFile(kafkaPOM())
	if err != nil {
		return "", fmt.Errorf("read the broker's pom.xml: %w", err)
	}
	m := kafkaVersionRE.FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s: no <kafka.version>", kafkaPOM())
	}
	return string(m[1]), nil
}

var jars struct {
	mu sync.Mutex
	cp string
}

// ApacheKafkaJars returns the classpath of the Apache Kafka broker (a
// directory wildcard java understands). The first call in a machine's
// life runs `mvn dependency:copy-dependencies` on the pom (jars from
// Maven Central, cached in ~/.m2 and in the pom's ignored target/ folder);
// a file lock keeps test binaries of several packages from fetching at
// once.
func ApacheKafkaJars() (string, error) {
	jars.mu.Lock()
	defer jars.mu.Unlock()
	if jars.cp != "" {
		return jars.cp, nil
	}
	v, err := ApacheKafkaVersion()
	if err != nil {
		return "", err
	}
	target := filepath.Join(filepath.Dir(kafkaPOM()), "target")
	dir := filepath.Join(target, "kafka-"+v)
	marker := filepath.Join(dir, ".complete")
	if _, err := os.Stat(marker); err != nil {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return "", err
		}
		if err := fetchJars(target, dir, marker); err != nil {
			return "", err
		}
	}
	jars.cp = filepath.Join(dir, "*")
	return jars.cp, nil
}

// fetchJars runs Maven under an exclusive lock on target/.lock, unless
// another process finished the fetch while this one waited for the lock.
func fetchJars(target, dir, marker string) error {
	lock, err := os.OpenFile(filepath.Join(target, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing unlocks too
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		return fmt.Errorf("mvn not on PATH (install the Debian package maven, or set FLOWLOG_TEST_KAFKA=kfake): %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_ = os.RemoveAll(dir) // a fetch cut short: start over
	cmd := exec.CommandContext(ctx, mvn, "-B", "-q", "-f", kafkaPOM(), "dependency:copy-dependencies")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("fetch the Apache Kafka broker with Maven: %w\n%s", err, out.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "kafka_2.13-"+filepath.Base(dir)[len("kafka-"):]+".jar")); err != nil {
		return fmt.Errorf("maven ran but the broker jar is missing: %w", err)
	}
	return os.WriteFile(marker, nil, 0o644)
}

// javaBin is $JAVA_HOME/bin/java when JAVA_HOME is set, else java on PATH.
func javaBin() string {
	if h := os.Getenv("JAVA_HOME"); h != "" {
		return filepath.Join(h, "bin", "java")
	}
	return "java"
}
