package main

import (
	"errors"

	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/meta"
)

// validGroup accepts a consumer group that is safe in an object name: the
// global checkpoint and catalog objects carry it.
func validGroup(g string) bool {
	if g == "" || len(g) > 128 || g == "." || g == ".." {
		return false
	}
	for i := 0; i < len(g); i++ {
		c := g[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// validateRedis is c.Validate without the password: a --redis-url that
// does not parse is reported redacted (url.Parse's own error quotes the
// whole URL).
func validateRedis(c meta.Config) error {
	if err := cli.CheckURL("--redis-url", c.URL); err != nil {
		rest := c // the other settings still get checked
		rest.URL, rest.Cluster = meta.DefaultURL, false
		return errors.Join(err, rest.Validate())
	}
	return c.Validate()
}
