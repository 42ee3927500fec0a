package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/flowlog/flowlog/internal/cli"
)

// flagSection is one titled group of flags in a command's help; a flag
// belongs to the first section whose names or prefixes match it.
type flagSection struct {
	title    string
	names    []string
	prefixes []string
}

func (s flagSection) has(name string) bool {
	for _, n := range s.names {
		if n == name {
			return true
		}
	}
	for _, p := range s.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// runSections are the help sections of `consumer run`.
var runSections = []flagSection{
	{title: "Kafka", names: []string{"brokers", "group", "apply-topic", "ddl-topic", "dlq-topic", "session-timeout"}, prefixes: []string{"kafka-"}},
	{title: "Redis", prefixes: []string{"redis-"}},
	{title: "GCS", prefixes: []string{"gcs-"}},
	{title: "Pipeline", names: []string{"temp-dir", "region-ttl", "start-offset", "store-id", "compression",
		"upload-parallelism", "fatal-after", "retry-backoff", "shutdown-timeout", "layout"},
		prefixes: []string{"flush-", "max-"}},
	{title: "HTTP and logs", names: []string{"http-addr", "log-format", "redact-logs", "stall-timeout"}, prefixes: []string{"admin-"}},
}

const runHelpIntro = `usage: consumer run [flags]

Consume the apply and DDL topics and back the flows' tables up to GCS.
Every flag also reads FLOWLOG_<NAME> from the environment (--flush-size:
FLOWLOG_FLUSH_SIZE); the command line wins. Sizes take B/KiB/MiB/GiB/TiB,
decimals allowed (1.5GiB).
`

// setupRunFlags installs the grouped help of `consumer run` on fs and makes
// a bad flag value (command line or environment) a reported problem instead
// of the end of parsing, so that an operator sees every problem at once,
// one line each. It must be called after every flag is registered; the
// returned func gives the bad values seen by the parse (nil if none).
func setupRunFlags(fs *flag.FlagSet) (badValues func() error) {
	fs.Usage = func() { writeGroupedHelp(fs.Output(), fs, runHelpIntro, runSections) }
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		lv := lenientValue{Value: f.Value, name: f.Name, errs: &errs}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = lenientBool{lv}
		} else {
			f.Value = lv
		}
	})
	return func() error { return errors.Join(errs...) }
}

// lenientValue records a failed Set as "--name: ..." and reports success,
// leaving the flag at its previous value.
type lenientValue struct {
	flag.Value
	name string
	errs *[]error
}

func (v lenientValue) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		*v.errs = append(*v.errs, fmt.Errorf("--%s: invalid value %q: %w", v.name, s, err))
	}
	return nil
}

// lenientBool is a lenientValue of a boolean flag, which takes no argument.
type lenientBool struct{ lenientValue }

func (lenientBool) IsBoolFlag() bool { return true }

// writeGroupedHelp writes intro and then fs's flags section by section, each
// with its type, usage, default and environment variable. Flags of no
// section are listed last under "Other".
func writeGroupedHelp(w io.Writer, fs *flag.FlagSet, intro string, sections []flagSection) {
	groups := make([][]*flag.Flag, len(sections)+1)
	fs.VisitAll(func(f *flag.Flag) {
		i := len(sections)
		for j, s := range sections {
			if s.has(f.Name) {
				i = j
				break
			}
		}
		groups[i] = append(groups[i], f)
	})
	fmt.Fprint(w, intro)
	for i, g := range groups {
		if len(g) == 0 {
			continue
		}
		title := "Other"
		if i < len(sections) {
			title = sections[i].title
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		for _, f := range g {
			fmt.Fprintf(w, "  --%s%s\n", f.Name, typeName(f))
			fmt.Fprintf(w, "        %s (%senv %s)\n", f.Usage, defaultText(f), cli.EnvName(f.Name))
		}
	}
}

// typeName is " <type>" of a flag that takes a value, "" for a boolean.
func typeName(f *flag.Flag) string {
	v := f.Value
	if l, ok := v.(lenientBool); ok {
		v = l.Value
	} else if l, ok := v.(lenientValue); ok {
		v = l.Value
	}
	if b, ok := v.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return ""
	}
	switch v.(type) {
	case *cli.Size:
		return " size"
	}
	name, _ := flag.UnquoteUsage(&flag.Flag{Name: f.Name, Usage: f.Usage, Value: v})
	if name == "" || name == "value" {
		return " value"
	}
	return " " + name
}

// defaultText is `default X, ` for a flag whose default is not the zero
// value.
func defaultText(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "0s", "false":
		return ""
	}
	if typeName(f) == " string" {
		return fmt.Sprintf("default %q, ", f.DefValue)
	}
	return "default " + f.DefValue + ", "
}
