// Package cli holds what the commands share for their command lines: the
// environment-to-flag mapping and the size flag type.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// EnvPrefix is the prefix of every environment variable that sets a flag.
const EnvPrefix = "FLOWLOG_"

// EnvName returns the environment variable that sets flag name:
// "flush-size" -> "FLOWLOG_FLUSH_SIZE".
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Parse parses args into fs, then sets every flag not given on the command
// line from its environment variable, if that is set. Command-line flags win
// over the environment.
//
// The flag package's own reporting is suppressed: -h or -help writes
// fs.Usage to fs.Output() and returns flag.ErrHelp; any other problem
// (unknown flag, bad value, bad environment variable) comes back as a
// *UsageError, which the command prints on one line with a pointer to its
// help instead of the whole flag list.
func Parse(fs *flag.FlagSet, args []string) error {
	_, err := ParseSources(fs, args)
	return err
}

// Sources maps the name of every flag that Parse set from the environment
// to that environment variable.
type Sources map[string]string

// ParseSources is Parse that also returns which flags the environment set,
// for Annotate.
func ParseSources(fs *flag.FlagSet, args []string) (Sources, error) {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		if fs.Usage != nil {
			fs.Usage()
		} else {
			fmt.Fprintf(out, "usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
		return nil, flag.ErrHelp
	case err != nil:
		return nil, &UsageError{Err: err}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	src := Sources{}
	var errs []string
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		env := EnvName(f.Name)
		v, ok := os.LookupEnv(env)
		if !ok {
			return
		}
		src[f.Name] = env
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Sprintf("%s=%q: invalid value for --%s: %v", env, v, f.Name, err))
		}
	})
	if len(errs) > 0 {
		return src, &UsageError{Err: fmt.Errorf("invalid environment: %s", strings.Join(errs, "; "))}
	}
	return src, nil
}

// Annotate returns err with " (from FLOWLOG_X)" appended to every line
// that names a flag the environment set: a line starting "--name" or
// "name:" (or "name " as in `redis-prefix "x": ...`), so that a problem
// found by a Validate is reported under the variable the operator has to
// fix. Lines naming no such flag are kept as they are; nil stays nil.
func (s Sources) Annotate(err error) error {
	if err == nil || len(s) == 0 {
		return err
	}
	lines := strings.Split(err.Error(), "\n")
	changed := false
	for i, line := range lines {
		if env := s.lineEnv(line); env != "" && !strings.Contains(line, env) {
			lines[i] = line + " (from " + env + ")"
			changed = true
		}
	}
	if !changed {
		return err
	}
	return annotated{msg: strings.Join(lines, "\n"), err: err}
}

// lineEnv is the environment variable of the flag that line starts with.
func (s Sources) lineEnv(line string) string {
	name := strings.TrimPrefix(line, "--")
	end := strings.IndexAny(name, ": (=")
	if end < 0 {
		return ""
	}
	return s[name[:end]]
}

// annotated is an error with a rewritten message that still unwraps to
// the original.
type annotated struct {
	msg string
	err error
}

func (a annotated) Error() string { return a.msg }
func (a annotated) Unwrap() error { return a.err }

// UsageError is a problem with the command line or the environment: the
// caller prints it on one line with a pointer to the command's -h.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError with a formatted message.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// Size is a byte count flag that accepts plain bytes or a number, decimals
// allowed, with a B, KiB, MiB, GiB or TiB suffix (also KB/MB/GB/TB and
// K/M/G/T, read as powers of 1024): "134217728", "128MiB", "1.5GiB".
type Size int64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"TB", 1 << 40},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// ParseSize parses a size as the Size flag does. A decimal is rounded down
// to whole bytes; plain bytes must be a whole number.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if len(t) > len(u.suffix) && strings.EqualFold(t[len(t)-len(u.suffix):], u.suffix) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	bad := fmt.Errorf("invalid size %q: want bytes or a number with B, KiB, MiB, GiB or TiB (1.5GiB)", s)
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n < 0 {
			return 0, bad
		}
		if n > math.MaxInt64/mult {
			return 0, fmt.Errorf("invalid size %q: too large", s)
		}
		return n * mult, nil
	}
	// A decimal: digits with one point, no exponent, no sign, no inf/nan.
	if mult == 1 || strings.Trim(t, "0123456789.") != "" || strings.Count(t, ".") != 1 || t == "." {
		return 0, bad
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil {
		return 0, bad
	}
	v := math.Floor(f * float64(mult))
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return int64(v), nil
}

// Set implements flag.Value.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// String implements flag.Value, printing the largest exact binary unit.
func (s *Size) String() string {
	if s == nil {
		return "0"
	}
	n := int64(*s)
	switch {
	case n != 0 && n%(1<<40) == 0:
		return fmt.Sprintf("%dTiB", n>>40)
	case n != 0 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n != 0 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n != 0 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.FormatInt(n, 10)
}
