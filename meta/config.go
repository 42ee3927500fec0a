package meta

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// DefaultURL is the default Redis URL (--redis-url).
const DefaultURL = "redis://127.0.0.1:6379/0"

// Config holds the Redis connection settings shared by every command that
// reads or writes flowlog's metadata.
type Config struct {
	// URL is a redis:// or rediss:// URL, e.g. redis://:pw@host:6379/0.
	URL string
	// Prefix goes in front of every key: "<prefix>:{flowlog}:...".
	Prefix string
	// Cluster makes URL a Redis Cluster seed list
	// (redis://host:port?addr=host2:port&addr=...). Every flowlog key carries
	// the {flowlog} hash tag, so all of them live in one slot and every
	// WATCH/MULTI transaction runs on one node.
	Cluster bool
}

// RegisterFlags registers --redis-url and --redis-prefix on f.
func (c *Config) RegisterFlags(f *flag.FlagSet) {
	f.StringVar(&c.URL, "redis-url", DefaultURL, "Redis URL (redis:// or rediss:// for TLS)")
	f.StringVar(&c.Prefix, "redis-prefix", DefaultPrefix, "prefix of every Redis key flowlog writes")
	f.BoolVar(&c.Cluster, "redis-cluster", false, "--redis-url names Redis Cluster seed nodes (more with ?addr=host:port&addr=...)")
}

// Validate checks that the URL parses and the prefix is usable in key names.
func (c *Config) Validate() error {
	if c.URL == "" {
		return errors.New("redis-url: must not be empty")
	}
	if c.Cluster {
		if _, err := redis.ParseClusterURL(c.URL); err != nil {
			return fmt.Errorf("redis-url: %w", err)
		}
	} else if _, err := redis.ParseURL(c.URL); err != nil {
		return fmt.Errorf("redis-url: %w", err)
	}
	if c.Prefix == "" {
		return errors.New("redis-prefix: must not be empty")
	}
	if strings.ContainsAny(c.Prefix, "{} \t\r\n") {
		return fmt.Errorf("redis-prefix %q: must not contain braces or whitespace", c.Prefix)
	}
	return nil
}

// NewClient opens a client for c.URL (redis:// or rediss://). The caller
// closes it.
func (c Config) NewClient() (redis.UniversalClient, error) {
	if c.Cluster {
		opts, err := redis.ParseClusterURL(c.URL)
		if err != nil {
			return nil, fmt.Errorf("parse redis-url: %w", err)
		}
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(c.URL)
	if err != nil {
		return nil, fmt.Errorf("parse redis-url: %w", err)
	}
	return redis.NewClient(opts), nil
}
