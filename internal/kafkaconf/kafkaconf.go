// Package kafkaconf holds the Kafka connection and topic settings that the
// consumer and the producer share, and turns them into franz-go options.
package kafkaconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Config is the Kafka part of the command line.
type Config struct {
	Brokers    string // comma-separated seed brokers
	ApplyTopic string
	DDLTopic   string
	DLQTopic   string

	TLS           bool
	TLSCAFile     string
	TLSCertFile   string
	TLSKeyFile    string
	SASLMechanism string // "", PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
	SASLUser      string
	SASLPassword  string
	// SASLAllowPlaintext accepts SASL PLAIN without TLS, which sends the
	// password in clear text.
	SASLAllowPlaintext bool
}

// Topic names one of the topics a command may use, for RegisterFlagsFor.
type Topic int

// The topics: apply events, flow DDL and the dead-letter queue.
const (
	ApplyTopic Topic = iota
	DDLTopic
	DLQTopic
)

// Default topic names.
const (
	DefaultApplyTopic = "flowlog.apply"
	DefaultDDLTopic   = "flowlog.ddl"
	DefaultDLQTopic   = "flowlog.dlq"
)

// RegisterFlags registers the Kafka connection flags and every topic flag
// on f.
func (c *Config) RegisterFlags(f *flag.FlagSet) {
	c.RegisterFlagsFor(f, ApplyTopic, DDLTopic, DLQTopic)
}

// RegisterFlagsFor registers the Kafka connection flags (brokers, TLS,
// SASL) and the flags of the topics given on f, so that a command's help
// lists only the topics it reads or writes. The other topics keep their
// default names.
func (c *Config) RegisterFlagsFor(f *flag.FlagSet, topics ...Topic) {
	c.ApplyTopic, c.DDLTopic, c.DLQTopic = DefaultApplyTopic, DefaultDDLTopic, DefaultDLQTopic
	f.StringVar(&c.Brokers, "brokers", "127.0.0.1:9092", "Kafka seed brokers, comma separated")
	for _, t := range topics {
		switch t {
		case ApplyTopic:
			f.StringVar(&c.ApplyTopic, "apply-topic", DefaultApplyTopic, "topic of apply events (ApplyBatch)")
		case DDLTopic:
			f.StringVar(&c.DDLTopic, "ddl-topic", DefaultDDLTopic, "topic of flow DDL (FlowDDL JSON)")
		case DLQTopic:
			f.StringVar(&c.DLQTopic, "dlq-topic", DefaultDLQTopic, "dead-letter topic for records that cannot be applied")
		}
	}
	f.BoolVar(&c.TLS, "kafka-tls", false, "connect to Kafka over TLS")
	f.StringVar(&c.TLSCAFile, "kafka-tls-ca", "", "PEM file of CAs to trust for Kafka (default: system roots)")
	f.StringVar(&c.TLSCertFile, "kafka-tls-cert", "", "PEM client certificate for Kafka mTLS")
	f.StringVar(&c.TLSKeyFile, "kafka-tls-key", "", "PEM client key for Kafka mTLS")
	f.StringVar(&c.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: none)")
	f.StringVar(&c.SASLUser, "kafka-sasl-user", "", "SASL user name")
	f.StringVar(&c.SASLPassword, "kafka-sasl-password", "", "SASL password (prefer the FLOWLOG_KAFKA_SASL_PASSWORD environment variable)")
	f.BoolVar(&c.SASLAllowPlaintext, "kafka-sasl-allow-plaintext", false, "allow SASL PLAIN without --kafka-tls, which sends the password in clear text")
}

// Validate reports every problem with c, one per line.
func (c *Config) Validate() error {
	var errs []error
	if len(c.SeedBrokers()) == 0 {
		errs = append(errs, errors.New("--brokers: at least one broker is required"))
	}
	for name, v := range map[string]string{"--apply-topic": c.ApplyTopic, "--ddl-topic": c.DDLTopic, "--dlq-topic": c.DLQTopic} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s: must not be empty", name))
		}
	}
	switch mech := strings.ToUpper(c.SASLMechanism); mech {
	case "":
		if c.SASLUser != "" || c.SASLPassword != "" {
			errs = append(errs, errors.New("--kafka-sasl-user/--kafka-sasl-password: set without --kafka-sasl-mechanism, they would be ignored"))
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if c.SASLUser == "" {
			errs = append(errs, fmt.Errorf("--kafka-sasl-user: required with --kafka-sasl-mechanism %s", mech))
		}
		if mech == "PLAIN" && !c.tls() && !c.SASLAllowPlaintext {
			errs = append(errs, errors.New("--kafka-sasl-mechanism PLAIN without --kafka-tls sends the password in clear text: "+
				"add --kafka-tls, or --kafka-sasl-allow-plaintext to accept that"))
		}
	default:
		errs = append(errs, fmt.Errorf("--kafka-sasl-mechanism: unknown mechanism %q", c.SASLMechanism))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("--kafka-tls-cert and --kafka-tls-key go together"))
	}
	return errors.Join(errs...)
}

// tls reports whether the connection uses TLS: --kafka-tls or any TLS file.
func (c *Config) tls() bool {
	return c.TLS || c.TLSCAFile != "" || c.TLSCertFile != ""
}

// SeedBrokers is Brokers split on commas, blanks dropped.
func (c *Config) SeedBrokers() []string {
	var out []string
	for _, b := range strings.Split(c.Brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// Opts returns the franz-go options for connecting: seeds, TLS and SASL.
func (c *Config) Opts() ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(c.SeedBrokers()...)}
	if c.tls() {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("read --kafka-tls-ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--kafka-tls-ca %s: no certificates found", c.TLSCAFile)
			}
		}
		if c.TLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
			if err != nil {
				return nil, fmt.Errorf("load Kafka client certificate: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case "":
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsSha512Mechanism()))
	}
	return opts, nil
}
