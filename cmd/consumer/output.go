package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
)

// output is where a command reports its result: lines of text on stdout,
// or with --json one JSON document on stdout and nothing else there
// (notes and warnings still go to stderr, progress only to a terminal).
// The documents are described in docs/SCRIPTING.md, "JSON output".
type output struct {
	json bool
}

// RegisterFlags registers --json on f.
func (o *output) RegisterFlags(f *flag.FlagSet) {
	f.BoolVar(&o.json, "json", false, `print the result as one JSON document on stdout instead of text (docs/SCRIPTING.md, "JSON output")`)
}

// printf prints a line of the text form; with --json it prints nothing.
// A nil output prints text.
func (o *output) printf(format string, args ...any) {
	if o == nil || !o.json {
		fmt.Fprintf(os.Stdout, format, args...)
	}
}

// result prints v as the JSON form; without --json it prints nothing.
func (o *output) result(v any) error {
	if o == nil || !o.json {
		return nil
	}
	return writeJSON(os.Stdout, v)
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// nonNil is s, or an empty slice for nil: a JSON list is [] when empty,
// never null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// tsJSON is a TSO with its wall time, as every JSON document gives one.
type tsJSON struct {
	TS   uint64 `json:"ts"`
	Time string `json:"time"` // RFC 3339 UTC of the TSO's physical part, "" for 0
}

func tsOf(ts uint64) tsJSON {
	if ts == 0 {
		return tsJSON{}
	}
	return tsJSON{TS: ts, Time: tsTime(ts)}
}
