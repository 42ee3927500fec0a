package main

import (
	"context"
	"errors"
)

func runRestore(ctx context.Context, args []string) error { return errors.New("not implemented yet") }
func runVerify(ctx context.Context, args []string) error  { return errors.New("not implemented yet") }
func runFlows(ctx context.Context, args []string) error   { return errors.New("not implemented yet") }
func runStatus(ctx context.Context, args []string) error  { return errors.New("not implemented yet") }
