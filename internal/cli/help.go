package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Section is one titled group of flags in a command's help; a flag belongs
// to the first section whose names or prefixes match it.
type Section struct {
	Title    string
	Names    []string
	Prefixes []string
}

func (s Section) has(name string) bool {
	for _, n := range s.Names {
		if n == name {
			return true
		}
	}
	for _, p := range s.Prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// NewFlagSet returns the flag set of one command, in the help style every
// command of both binaries shares: -h writes intro and then the command's
// flags, grouped by sections with their type, default and FLOWLOG_*
// variable, to stdout (so that `consumer restore -h | less` works), and
// parsing reports problems as *UsageError (see Parse). Flags of no section
// are listed first, under own, the command's own section title.
func NewFlagSet(name, intro, own string, sections ...Section) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	fs.Usage = func() { WriteHelp(fs.Output(), fs, intro, own, sections) }
	return fs
}

// WriteHelp writes intro and then fs's flags section by section, each with
// its type, usage, default and environment variable. Flags of no section
// come first, under own ("Other" if empty); sections with no flag of fs are
// left out, so one list of sections serves commands that use some of them.
func WriteHelp(w io.Writer, fs *flag.FlagSet, intro, own string, sections []Section) {
	groups := make([][]*flag.Flag, len(sections)+1) // [0]: own
	fs.VisitAll(func(f *flag.Flag) {
		i := 0
		for j, s := range sections {
			if s.has(f.Name) {
				i = j + 1
				break
			}
		}
		groups[i] = append(groups[i], f)
	})
	if own == "" {
		own = "Other"
	}
	fmt.Fprint(w, intro)
	for i, g := range groups {
		if len(g) == 0 {
			continue
		}
		title := own
		if i > 0 {
			title = sections[i-1].Title
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		for _, f := range g {
			fmt.Fprintf(w, "  --%s%s\n", f.Name, typeName(f))
			fmt.Fprintf(w, "        %s (%senv %s)\n", f.Usage, defaultText(f), EnvName(f.Name))
		}
	}
}

// unwrapper is a flag.Value that wraps another (Lenient's values).
type unwrapper interface{ Unwrap() flag.Value }

// typeName is " <type>" of a flag that takes a value, "" for a boolean.
func typeName(f *flag.Flag) string {
	v := f.Value
	for {
		u, ok := v.(unwrapper)
		if !ok {
			break
		}
		v = u.Unwrap()
	}
	if b, ok := v.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return ""
	}
	if _, ok := v.(*Size); ok {
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

// Lenient makes a bad flag value (command line or environment) of fs a
// reported problem instead of the end of parsing, so that an operator sees
// every problem at once, one line each. It must be called after every flag
// is registered; the returned func gives the bad values seen by the parse
// (nil if none).
func Lenient(fs *flag.FlagSet) (badValues func() error) {
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

func (v lenientValue) Unwrap() flag.Value { return v.Value }

// lenientBool is a lenientValue of a boolean flag, which takes no argument.
type lenientBool struct{ lenientValue }

func (lenientBool) IsBoolFlag() bool { return true }
