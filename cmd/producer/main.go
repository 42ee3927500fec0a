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

	"github.com/flowlog/flowlog/internal/cli"
)

const usage = `usage: producer <command> [flags]

commands:
  load       publish a deterministic load of apply events (see producer load -h)
  flow       publish flow DDL: flow create|replace|drop|resume (see producer flow -h)
  heartbeat  publish heartbeats that advance every region's resolved ts
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// run runs the command of args and returns the exit code: 0, 1 for a
// failure, 2 for a bad command line.
func run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	if cmd == "help" && len(args) > 0 {
		// "producer help C" is "producer C -h".
		cmd, args = args[0], []string{"-h"}
	}
	var err error
	switch cmd {
	case "load":
		err = runLoad(ctx, args)
	case "flow":
		err = runFlow(ctx, args)
	case "heartbeat":
		err = runHeartbeat(ctx, args)
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "producer: unknown command %q (run 'producer help' for the list)\n", cmd)
		return 2
	}
	var ue *cli.UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "producer %s: %v (run 'producer %s -h' for help)\n", cmd, err, cmd)
		return 2
	}
	fmt.Fprintf(os.Stderr, "producer %s: %v\n", cmd, err)
	return 1
}
