package main

import (
	"context"
	"errors"
)

// runFlow is implemented by the flow DDL client.
func runFlow(ctx context.Context, args []string) error { return errors.New("not implemented yet") }
