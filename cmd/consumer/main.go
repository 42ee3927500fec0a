// Command consumer is the flowlog daemon and its operator subcommands.
//
//	consumer [run] [flags]      back up the apply topic into GCS (the default)
//	consumer dev                everything embedded, for a first run on a bare machine
//	consumer restore --flow F --ts T --out DIR
//	consumer verify --flow F
//	consumer snapshot --flow F [--ts T]
//	consumer flows | status
//	consumer truncate --flow F --until TS
//	consumer gc [--grace 1h]
//	consumer recover [--dry-run]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/cli"
)

const usage = `usage: consumer [command] [flags]

commands:
  run       consume the apply and DDL topics and back flows up to GCS (default)
  dev       run everything embedded (Kafka, GCS, Redis if none) with a demo flow and load
  restore   write a flow's tables as of a timestamp: restore --flow F [--ts T] --out DIR
  verify    check a flow's backup: verify --flow F
  snapshot  save a flow's tables as of a timestamp so restores start there: snapshot --flow F [--ts T]
  flows     list flows with their state and checkpoint
  status    show partitions, lag, temp bytes and the last cycle
  truncate  drop a flow's log before a snapshot: truncate --flow F --until TS [--dry-run]
  gc        delete objects nothing references: gc [--grace 1h] [--dry-run]
  recover   rebuild Redis from the bucket after Redis lost its state: recover [--dry-run]

Every flag also reads FLOWLOG_<NAME> from the environment (--flush-size: FLOWLOG_FLUSH_SIZE).
Run "consumer <command> -h" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

// commands are the subcommands by name.
var commands = map[string]func(context.Context, []string) error{
	"run":     runRun,
	"dev":     runDev,
	"restore": runRestore,
	"verify":  runVerify,
	"flows":   runFlows,
	"status":  runStatus,
	// snapshots and retention (docs/RESTORE.md)
	"snapshot": runSnapshot,
	"truncate": runTruncate,
	"gc":       runGC,
	// losing Redis (docs/OPERATING.md)
	"recover": runRecover,
}

// run runs the command of args and returns the exit code: 0, 1 for a
// failure, 2 for a bad command line.
func run(args []string) int {
	redis.SetLogger(redisLog{}) // run and dev route it to their logger
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	} else if len(args) > 0 && isHelp(args[0]) {
		cmd, args = "help", args[1:]
	}
	if cmd == "help" {
		// "consumer help" lists the commands; "consumer help C" is C -h.
		if len(args) == 0 {
			fmt.Print(usage)
			return 0
		}
		cmd, args = args[0], []string{"-h"}
	}
	fn, ok := commands[cmd]
	if !ok {
		fmt.Fprintf(os.Stderr, "consumer: unknown command %q (run 'consumer help' for the list)\n", cmd)
		return 2
	}
	err := fn(context.Background(), args)
	var (
		exit  exitError
		usage *cli.UsageError
	)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &exit):
		if exit.msg != "" {
			fmt.Fprintln(os.Stderr, exit.msg)
		}
		return exit.code
	case errors.As(err, &usage):
		fmt.Fprintf(os.Stderr, "consumer %s: %v (run 'consumer %s -h' for help)\n", cmd, err, cmd)
		return 2
	}
	fmt.Fprintf(os.Stderr, "consumer %s: %v\n", cmd, err)
	return 1
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help":
		return true
	}
	return false
}

// exitError makes main exit with code after printing msg (if any), for
// commands such as verify whose failure is a result, not an error.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return fmt.Sprintf("exit %d: %s", e.code, e.msg) }
