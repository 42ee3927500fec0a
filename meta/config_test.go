package meta_test

import (
	"context"
	"flag"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/meta"
)

func TestConfig(t *testing.T) {
	var c meta.Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if c.URL != "redis://127.0.0.1:6379/0" || c.Prefix != "flowlog" {
		t.Fatalf("defaults = %+v", c)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr bool
	}{
		{"defaults", nil, false},
		{"tls", []string{"--redis-url", "rediss://:pw@example:6380/1"}, false},
		{"custom prefix", []string{"--redis-prefix", "team-a"}, false},
		{"bad scheme", []string{"--redis-url", "http://x"}, true},
		{"empty url", []string{"--redis-url", ""}, true},
		{"empty prefix", []string{"--redis-prefix", ""}, true},
		{"prefix with hash tag", []string{"--redis-prefix", "a{b}"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c meta.Config
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			c.RegisterFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); (err != nil) != tc.wantErr {
				t.Fatalf("Validate() = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}

func TestConfigNewClient(t *testing.T) {
	r := startRedis(t)
	rdb, err := meta.Config{URL: r.URL, Prefix: "p"}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping: %v", err)
	}

	tlsClient, err := meta.Config{URL: "rediss://127.0.0.1:1/0"}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer tlsClient.Close()
	if c, ok := tlsClient.(*redis.Client); !ok || c.Options().TLSConfig == nil {
		t.Fatal("rediss:// client has no TLS config")
	}
}
