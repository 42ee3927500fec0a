// Command producer publishes to flowlog's Kafka topics: a deterministic load
// of TiKV-shaped apply events, flow DDL, and region heartbeats.
//
//	producer load --events N --tables 1,2,3 --regions R --value-size B --rate R --seed S
//	producer flow create|replace|drop|resume --name F --tables 1,2 [--catalog C ...]
//	producer heartbeat
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: producer <command> [flags]

commands:
  load       publish a deterministic load of apply events (see producer load -h)
  flow       publish flow DDL: flow create|replace|drop|resume (see producer flow -h)
  heartbeat  publish heartbeats that advance every region's resolved ts
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "load":
		err = runLoad(ctx, args)
	case "flow":
		err = runFlow(ctx, args)
	case "heartbeat":
		err = runHeartbeat(ctx, args)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "producer: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "producer %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
