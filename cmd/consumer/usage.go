package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/flowlog/flowlog/internal/cli"
)

// helpText is each command's help: its usage line, a one-line summary for
// `consumer help` and, if the summary does not say enough, more.
type helpText struct {
	usage, summary, more string
}

// commandHelp is the help of every command, in the order `consumer help`
// lists them.
var commandHelp = []struct {
	name string
	helpText
}{
	{"run", helpText{"run [flags]", "consume the apply and DDL topics and back flows up to GCS (default)", ""}},
	{"dev", helpText{"dev [flags]", "run everything embedded (Kafka, GCS, Redis if none) with a demo flow and load", devHelpMore}},
	{"restore", helpText{"restore --flow F [--ts T] --out DIR [flags]", "write a flow's tables as of a timestamp",
		"Each table goes to DIR/<table_id>.jsonl. An interrupt removes the sort files and\n" +
			"what this run wrote: --out is left as it was before the run. --tables and\n" +
			"--start-key/--end-key select what is read: only the chunks that can hold\n" +
			"selected keys are fetched.\n"}},
	{"verify", helpText{"verify --flow F [flags]", "check every object and checksum of a flow's backup; exit 1 on a fault", ""}},
	{"snapshot", helpText{"snapshot --flow F [--ts T] [flags]", "save a flow's tables as of a timestamp so restores start there", ""}},
	{"flows", helpText{"flows [flags]", "list flows with their state, checkpoint and coverage", ""}},
	{"status", helpText{"status [flags]", "show partitions, leases, lag, flows and the running consumer's last cycle", ""}},
	{"truncate", helpText{"truncate --flow F --until TS [--dry-run] [flags]", "drop a flow's log before a snapshot", ""}},
	{"gc", helpText{"gc [--grace 1h] [--dry-run] [flags]", "delete objects nothing references", ""}},
	{"recover", helpText{"recover [--dry-run] [flags]", "rebuild Redis from the bucket after Redis lost its state", ""}},
	{"version", helpText{"version [--json]", "print the build: module version, VCS revision, Go version", ""}},
}

// devHelpMore is the rest of dev's help (here, not in dev.go: a nodev
// build still describes the command it leaves out).
const devHelpMore = `Run flowlog end to end on this machine: an embedded Kafka broker and GCS
emulator (data under --data-dir), Redis at --redis-url if it answers, else
a private redis-server (or an in-memory emulator), a demo flow and a demo
load; then print what landed where and the commands to look at it.
--brokers and --gcs-endpoint, if given, are where the embedded Kafka and
GCS listen (127.0.0.1:PORT), so a sourced .flowlog-dev/env keeps working
across runs. The other flags are those of run, with dev's defaults.
`

// envNote ends every command's help.
const envNote = `Every flag also reads FLOWLOG_<NAME> from the environment (--flush-size:
FLOWLOG_FLUSH_SIZE); the command line wins. Sizes take B/KiB/MiB/GiB/TiB,
decimals allowed (1.5GiB). Exit codes: 0 done, 1 failed, 2 bad command line
or configuration, 130 interrupted.
`

// usage is `consumer help`: the commands.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: consumer [command] [flags]\n\ncommands:\n")
	for _, c := range commandHelp {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	b.WriteString("\n" + envNote + "Run \"consumer <command> -h\" for a command's flags; \"consumer --version\" for the build.\n")
	return b.String()
}

// help returns command name's help text.
func help(name string) helpText {
	for _, c := range commandHelp {
		if c.name == name {
			return c.helpText
		}
	}
	panic("no help text for command " + name)
}

// Help sections shared by the commands: a command lists only those it has
// flags of, and its own flags come first under its name.
var (
	kafkaSection = cli.Section{Title: "Kafka", Names: []string{"brokers", "group", "apply-topic", "ddl-topic", "dlq-topic", "session-timeout"},
		Prefixes: []string{"kafka-"}}
	redisSection = cli.Section{Title: "Redis", Prefixes: []string{"redis-"}}
	gcsSection   = cli.Section{Title: "GCS", Prefixes: []string{"gcs-"}}
	// groupSection is where an operator command lists the flags that say
	// whose backup it reads: group, clock bound, the running consumer.
	groupSection  = cli.Section{Title: "Consumer group and clock", Names: []string{"group", "max-clock-skew", "http-addr"}}
	outputSection = cli.Section{Title: "Output and metrics", Names: []string{"json"}, Prefixes: []string{"metrics-"}}
)

// opSections are the help sections of the operator commands.
var opSections = []cli.Section{
	{Title: kafkaSection.Title, Names: []string{"brokers", "apply-topic"}, Prefixes: kafkaSection.Prefixes},
	redisSection, gcsSection, groupSection, outputSection,
}

// runSections are the help sections of `consumer run`.
var runSections = []cli.Section{
	kafkaSection, redisSection, gcsSection,
	{Title: "Pipeline", Names: []string{"temp-dir", "region-ttl", "start-offset", "store-id", "compression",
		"upload-parallelism", "fatal-after", "retry-backoff", "shutdown-timeout", "layout"},
		Prefixes: []string{"flush-", "max-"}},
	{Title: "HTTP and logs", Names: []string{"http-addr", "log-format", "redact-logs", "stall-timeout"}, Prefixes: []string{"admin-"}},
}

// intro is the start of command name's help.
func intro(name string) string {
	h := help(name)
	s := "usage: consumer " + h.usage + "\n\n" + strings.ToUpper(h.summary[:1]) + h.summary[1:] + ".\n"
	if h.more != "" {
		s += h.more
	}
	return s + envNote
}

// newFlagSet is the flag set of `consumer <name>` with the shared help
// style: its own flags first, then the operator sections it has flags of.
func newFlagSet(name string) *flag.FlagSet {
	return cli.NewFlagSet("consumer "+name, intro(name), strings.ToUpper(name[:1])+name[1:], opSections...)
}
