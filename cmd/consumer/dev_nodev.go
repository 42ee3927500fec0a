//go:build nodev

package main

import (
	"context"
	"errors"
)

// errNoDev is what `consumer dev` says in a binary built without it.
var errNoDev = errors.New("not in this binary (built with -tags nodev, as the Docker image is, to leave out the embedded " +
	"Kafka, GCS and Redis); from a source checkout run 'go run ./cmd/consumer dev'")

// runDev reports that dev was left out of this build.
func runDev(context.Context, []string) error { return errNoDev }
