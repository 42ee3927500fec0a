package kafkaconf_test

import (
	"flag"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/internal/kafkaconf"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string // substrings of the error, one per problem; none: valid
	}{
		{"defaults", nil, nil},
		{"sasl scram", []string{"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "u"}, nil},
		{"no brokers", []string{"--brokers", " , "}, []string{"--brokers"}},
		{"empty topic", []string{"--ddl-topic", ""}, []string{"--ddl-topic"}},
		{"bad mechanism", []string{"--kafka-sasl-mechanism", "GSSAPI"}, []string{"GSSAPI"}},
		{"cert without key", []string{"--kafka-tls-cert", "c.pem"}, []string{"go together"}},
		{"every problem reported", []string{"--brokers", "", "--apply-topic", "", "--kafka-sasl-mechanism", "x"},
			[]string{"--brokers", "--apply-topic", "mechanism"}},
		{"sasl plain over tls", []string{"--kafka-sasl-mechanism", "plain", "--kafka-sasl-user", "u", "--kafka-tls"}, nil},
		{"sasl plain, clear text allowed", []string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u",
			"--kafka-sasl-allow-plaintext"}, nil},
		{"sasl plain in clear text", []string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u", "--kafka-sasl-password", "p"},
			[]string{"PLAIN without --kafka-tls sends the password in clear text"}},
		{"password without mechanism", []string{"--kafka-sasl-password", "p"}, []string{"set without --kafka-sasl-mechanism"}},
		{"user without mechanism", []string{"--kafka-sasl-user", "u"}, []string{"set without --kafka-sasl-mechanism"}},
		{"mechanism without user", []string{"--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-password", "p"},
			[]string{"--kafka-sasl-user: required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			var c kafkaconf.Config
			c.RegisterFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if _, err := c.Opts(); err != nil {
					t.Fatalf("Opts() = %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to mention %q", err, w)
				}
			}
			if got := strings.Count(err.Error(), "\n") + 1; got != len(tc.want) {
				t.Errorf("Validate() reported %d lines, want one per problem (%d): %q", got, len(tc.want), err)
			}
		})
	}
}

func TestSeedBrokersAndTLSFiles(t *testing.T) {
	c := kafkaconf.Config{Brokers: " a:1, ,b:2 ", ApplyTopic: "a", DDLTopic: "d", DLQTopic: "q"}
	if got := strings.Join(c.SeedBrokers(), "|"); got != "a:1|b:2" {
		t.Fatalf("SeedBrokers() = %q, want a:1|b:2", got)
	}
	c.TLSCAFile = "/nonexistent/ca.pem"
	if _, err := c.Opts(); err == nil || !strings.Contains(err.Error(), "kafka-tls-ca") {
		t.Fatalf("Opts() with a missing CA file = %v, want an error naming --kafka-tls-ca", err)
	}
}
