package main

import (
	"context"
	"errors"
)

// runLoad is implemented by the load generator.
func runLoad(ctx context.Context, args []string) error { return errors.New("not implemented yet") }

// runHeartbeat is implemented by the load generator.
func runHeartbeat(ctx context.Context, args []string) error { return errors.New("not implemented yet") }
