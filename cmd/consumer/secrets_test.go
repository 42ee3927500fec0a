package main

import (
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestSecretsStayOut checks that a password in --redis-url is never printed,
// SASL PLAIN without TLS needs --kafka-sasl-allow-plaintext, and SASL
// credentials without a mechanism are refused.
func TestSecretsStayOut(t *testing.T) {
	const secret = "s3cret"
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad redis url", []string{"flows", "--redis-url", "redis://:" + secret + "%zz@h:1/0"},
			`--redis-url redis://:xxxxx@h:1/0: not a valid URL: invalid URL escape "xxxxx"`},
		{"bad redis url and prefix", []string{"run", "--redis-url", "redis://u:" + secret + "@h:x/0", "--redis-prefix", "a{b"},
			`--redis-url redis://u:xxxxx@h:x/0: not a valid URL: invalid port ":x" after host`},
		{"sasl plain in clear text", []string{"run", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u", "--kafka-sasl-password", secret},
			"--kafka-sasl-mechanism PLAIN without --kafka-tls sends the password in clear text: add --kafka-tls, or --kafka-sasl-allow-plaintext to accept that"},
		{"sasl password without mechanism", []string{"status", "--kafka-sasl-password", secret},
			"--kafka-sasl-user/--kafka-sasl-password: set without --kafka-sasl-mechanism, they would be ignored"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runConsumer(t, 20*time.Second, nil, tc.args...)
			if r.code != 2 || !strings.Contains(r.stderr, "invalid configuration:\n") || !strings.Contains(r.stderr, "\n"+tc.want+"\n") {
				t.Fatalf("exit %d; stderr:\n%s\nwant exit 2 and a line %q", r.code, r.stderr, tc.want)
			}
			if strings.Contains(r.stdout+r.stderr, secret) {
				t.Errorf("output leaks the secret:\n%s%s", r.stdout, r.stderr)
			}
		})
	}
	t.Run("sasl plain in clear text, allowed", func(t *testing.T) {
		// The configuration is accepted: status goes on to Kafka (whose
		// test broker speaks no SASL) instead of refusing its flags.
		rd, k := testenv.StartRedis(t), testenv.StartKafka(t, 1)
		r := runConsumer(t, 20*time.Second, nil, "status", "--redis-url", rd.URL, "--brokers", k.Brokers(), "--http-addr", "", "--kafka-sasl-mechanism", "PLAIN",
			"--kafka-sasl-user", "u", "--kafka-sasl-password", secret, "--kafka-sasl-allow-plaintext")
		if r.code == 2 || strings.Contains(r.stderr, "invalid configuration") || strings.Contains(r.stdout+r.stderr, secret) {
			t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
		}
	})
}
