// Command producer publishes to flowlog's Kafka topics: a deterministic load
// of TiKV-shaped apply events, flow DDL, and region heartbeats.
//
//	producer load --events N --tables 1,2,3 --regions R --value-size B --rate R --seed S
//	producer flow create|replace|drop|resume --name F --tables 1,2 [--catalog C ...]
//	producer heartbeat
//	producer version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/flowlog/flowlog/internal/buildinfo"
	"github.com/flowlog/flowlog/internal/cli"
)

// commandHelp is each command's help, in the order `producer help` lists
// them: its usage line, one line for the list, and more for its -h.
var commandHelp = []struct{ name, usage, summary, more string }{
	{"load", "load [flags]", "publish a deterministic load of apply events",
		"The same seed and flags give the same data (internal/loadgen), so a test can\ncompute what a restore must hold. Progress goes to stderr on a terminal.\n"},
	{"flow", "flow create|replace|drop|resume --name F [--tables 1,2] [flags]", "publish flow DDL", flowMore},
	{"heartbeat", "heartbeat [flags]", "publish heartbeats that advance every region's resolved ts", ""},
	{"version", "version", "print the build: module version, VCS revision, Go version", ""},
}

// commands are the subcommands by name.
var commands = map[string]func(context.Context, []string) error{
	"load":      runLoad,
	"flow":      runFlow,
	"heartbeat": runHeartbeat,
	"version":   runVersion,
}

// envNote ends the help of every command and of the command list.
const envNote = `Every flag also reads FLOWLOG_<NAME> from the environment (--brokers:
FLOWLOG_BROKERS, --kafka-sasl-password: FLOWLOG_KAFKA_SASL_PASSWORD); the
command line wins. Exit codes: 0 done, 1 failed, 2 bad command line, 130
interrupted.
`

// sections are the help sections of every producer command.
var sections = []cli.Section{
	{Title: "Kafka", Names: []string{"brokers", "apply-topic", "ddl-topic", "dlq-topic", "timeout"}, Prefixes: []string{"kafka-"}},
	{Title: "Redis (--wait)", Names: []string{"wait", "wait-timeout"}, Prefixes: []string{"redis-"}},
}

func usage() string {
	var b strings.Builder
	b.WriteString("usage: producer <command> [flags]\n\ncommands:\n")
	for _, c := range commandHelp {
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, c.summary)
	}
	b.WriteString("\n" + envNote + "Run \"producer <command> -h\" for a command's flags; \"producer --version\" for the build.\n")
	return b.String()
}

// newFlagSet is the flag set of `producer <name>` in the help style every
// command of both binaries shares.
func newFlagSet(name string) *flag.FlagSet {
	for _, c := range commandHelp {
		if c.name == name {
			intro := "usage: producer " + c.usage + "\n\n" + strings.ToUpper(c.summary[:1]) + c.summary[1:] + ".\n" + c.more + envNote
			return cli.NewFlagSet("producer "+name, intro, strings.ToUpper(name[:1])+name[1:], sections...)
		}
	}
	panic("no help text for command " + name)
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:]))
}

// run runs the command of args and returns the exit code: 0, 1 for a
// failure, 2 for a bad command line, 130 for a command an interrupt stopped.
func run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage())
		return 2
	}
	cmd, args := args[0], args[1:]
	switch {
	case cmd == "help" && len(args) > 0:
		// "producer help C" is "producer C -h".
		cmd, args = args[0], []string{"-h"}
	case cmd == "-h", cmd == "-help", cmd == "--help", cmd == "help":
		fmt.Print(usage())
		return 0
	case cmd == "--version":
		cmd = "version"
	}
	fn, ok := commands[cmd]
	if !ok {
		fmt.Fprintf(os.Stderr, "producer: unknown command %q (run 'producer help' for the list)\n", cmd)
		return 2
	}
	ctx, stop := cli.Interrupt(ctx, func(os.Signal) {
		fmt.Fprintf(os.Stderr, "producer %s: interrupt: stopping (interrupt again to stop at once)\n", cmd)
	}, nil)
	err := fn(ctx, args)
	interrupted := cli.Interrupted(ctx)
	stop()
	var ue *cli.UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case interrupted:
		fmt.Fprintf(os.Stderr, "producer %s: interrupted: %v\n", cmd, err)
		return cli.ExitInterrupted
	case errors.As(err, &ue) && strings.Contains(err.Error(), "\n"):
		fmt.Fprintf(os.Stderr, "producer %s: %v\n", cmd, err)
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "producer %s: %v (run 'producer %s -h' for help)\n", cmd, err, cmd)
		return 2
	}
	fmt.Fprintf(os.Stderr, "producer %s: %v\n", cmd, err)
	return 1
}

// runVersion is `producer version` (and `producer --version`).
func runVersion(_ context.Context, args []string) error {
	fs := newFlagSet("version")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments %q", fs.Args())
	}
	fmt.Printf("producer %s\n", buildinfo.Get())
	return nil
}
