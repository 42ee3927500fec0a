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
//	consumer version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/buildinfo"
	"github.com/flowlog/flowlog/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// command is one subcommand. Adding a command is one entry here and one
// in commandHelp; its runner parses with newFlagSet, reports through an
// output and a progressLine, and stops on ctx, which the first interrupt
// cancels (see run).
type command struct {
	run func(context.Context, []string) error
	// ownSignals: the command handles SIGINT and SIGTERM itself (run and
	// dev stop gracefully, committing what they consumed).
	ownSignals bool
}

// commands are the subcommands by name.
var commands = map[string]command{
	"run":     {run: runRun, ownSignals: true},
	"dev":     {run: runDev, ownSignals: true},
	"restore": {run: runRestore},
	"verify":  {run: runVerify},
	"flows":   {run: runFlows},
	"status":  {run: runStatus},
	// snapshots and retention (docs/RESTORE.md)
	"snapshot": {run: runSnapshot},
	"truncate": {run: runTruncate},
	"gc":       {run: runGC},
	// republishing a backup (docs/RESTORE.md, "Replay")
	"replay": {run: runReplay},
	// losing Redis (docs/OPERATING.md)
	"recover": {run: runRecover},
	"version": {run: runVersion},
}

// run runs the command of args and returns the exit code: 0, 1 for a
// failure, 2 for a bad command line or configuration, 130 for a command an
// interrupt stopped.
func run(args []string) int {
	redis.SetLogger(redisLog{}) // run and dev route it to their logger
	cmd := "run"
	switch {
	case len(args) > 0 && !strings.HasPrefix(args[0], "-"):
		cmd, args = args[0], args[1:]
	case len(args) > 0 && isHelp(args[0]):
		cmd, args = "help", args[1:]
	case len(args) > 0 && args[0] == "--version":
		cmd, args = "version", args[1:]
	}
	if cmd == "help" {
		// "consumer help" lists the commands; "consumer help C" is C -h.
		if len(args) == 0 {
			fmt.Print(usage())
			return 0
		}
		cmd, args = args[0], []string{"-h"}
	}
	c, ok := commands[cmd]
	if !ok {
		fmt.Fprintf(os.Stderr, "consumer: unknown command %q (run 'consumer help' for the list)\n", cmd)
		return 2
	}
	ctx, stop := context.Background(), func() {}
	if !c.ownSignals {
		ctx, stop = cli.Interrupt(ctx, func(os.Signal) {
			fmt.Fprintf(os.Stderr, "consumer %s: interrupt: stopping and cleaning up (interrupt again to stop at once, leaving temp files)\n", cmd)
		}, func() {
			fmt.Fprintf(os.Stderr, "consumer %s: second interrupt: stopped at once; temp files under --temp-dir may be left\n", cmd)
		})
	}
	err := c.run(ctx, args)
	interrupted := cli.Interrupted(ctx)
	stop()
	return exitCode(cmd, err, interrupted)
}

// exitCode prints err for command cmd and returns the exit code.
func exitCode(cmd string, err error, interrupted bool) int {
	var (
		exit  exitError
		usage *cli.UsageError
		intr  *cli.InterruptedError
	)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &intr):
		fmt.Fprintf(os.Stderr, "consumer %s: interrupted: %v\n", cmd, intr)
		return cli.ExitInterrupted
	case interrupted:
		fmt.Fprintf(os.Stderr, "consumer %s: interrupted: %v\n", cmd, err)
		return cli.ExitInterrupted
	case errors.As(err, &exit):
		if exit.msg != "" {
			fmt.Fprintln(os.Stderr, exit.msg)
		}
		return exit.code
	case errors.As(err, &usage) && strings.Contains(err.Error(), "\n"):
		// One problem a line, each naming its flag or variable.
		fmt.Fprintf(os.Stderr, "consumer %s: %v\n", cmd, err)
		return 2
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

// runVersion is `consumer version` (and `consumer --version`).
func runVersion(_ context.Context, args []string) error {
	fs := newFlagSet("version")
	var out output
	out.RegisterFlags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments %q", fs.Args())
	}
	info := buildinfo.Get()
	out.printf("consumer %s\n", info)
	return out.result(info)
}
