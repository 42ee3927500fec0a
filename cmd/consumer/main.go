// Command consumer is the flowlog daemon and its operator subcommands.
//
//	consumer [run] [flags]      back up the apply topic into GCS (the default)
//	consumer dev                everything embedded, for a first run on a bare machine
//	consumer restore --flow F --ts T --out DIR
//	consumer verify --flow F
//	consumer flows | status
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

const usage = `usage: consumer [command] [flags]

commands:
  run       consume the apply and DDL topics and back flows up to GCS (default)
  dev       run everything embedded (Kafka, GCS, Redis if none) with a demo flow and load
  restore   write a flow's tables as of a timestamp: restore --flow F [--ts T] --out DIR
  verify    check a flow's backup: verify --flow F
  flows     list flows with their state and checkpoint
  status    show partitions, lag, temp bytes and the last cycle

Every flag also reads FLOWLOG_<NAME> from the environment (--flush-size: FLOWLOG_FLUSH_SIZE).
Run "consumer <command> -h" for a command's flags.
`

func main() {
	args := os.Args[1:]
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	run, ok := map[string]func(context.Context, []string) error{
		"run":     runRun,
		"dev":     runDev,
		"restore": runRestore,
		"verify":  runVerify,
		"flows":   runFlows,
		"status":  runStatus,
	}[cmd]
	if !ok {
		if cmd == "help" {
			fmt.Print(usage)
			return
		}
		fmt.Fprintf(os.Stderr, "consumer: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	err := run(context.Background(), args)
	var exit exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, &exit):
		if exit.msg != "" {
			fmt.Fprintln(os.Stderr, exit.msg)
		}
		os.Exit(exit.code)
	default:
		fmt.Fprintf(os.Stderr, "consumer %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

// exitError makes main exit with code after printing msg (if any), for
// commands such as verify whose failure is a result, not an error.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return fmt.Sprintf("exit %d: %s", e.code, e.msg) }
