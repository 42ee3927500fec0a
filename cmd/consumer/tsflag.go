package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flowlog/flowlog/event"
)

// tsTime renders a TSO as the UTC wall time of its physical part.
func tsTime(ts uint64) string {
	if ts == 0 {
		return "-"
	}
	return event.PhysicalTime(ts).UTC().Format(time.RFC3339Nano)
}

// tsFlag is --ts: a TSO, an RFC 3339 time, or a negative duration counted
// back from when the flag is parsed. A time becomes the last TSO of its
// millisecond, so that a restore as of a time includes what committed at
// that time.
type tsFlag struct {
	arg  string
	form string // "" for a TSO, else "time" or "duration"
	ts   uint64
}

func (f *tsFlag) String() string { return f.arg }

func (f *tsFlag) Set(s string) error {
	ts, form, err := parseTS(s, time.Now())
	if err != nil {
		return err
	}
	*f = tsFlag{arg: s, form: form, ts: ts}
	return nil
}

// describe renders the flag and, for a time or duration, the TSO it became.
func (f *tsFlag) describe() string {
	if f.form == "" {
		return f.arg
	}
	return fmt.Sprintf("%s is TSO %d (%s)", f.arg, f.ts, tsTime(f.ts))
}

const tsForms = "want a TSO (431656320867237891), an RFC 3339 time (2026-12-01T10:00:00Z) or a negative duration (-15m)"

// parseTS reads a --ts value as of now.
func parseTS(s string, now time.Time) (ts uint64, form string, err error) {
	if s == "" {
		return 0, "", fmt.Errorf("empty: %s", tsForms)
	}
	if s[0] >= '0' && s[0] <= '9' && !strings.ContainsAny(s, "-:T") {
		ts, err := strconv.ParseUint(s, 10, 64)
		if err != nil || ts == 0 {
			return 0, "", fmt.Errorf("%q: not a TSO: %s", s, tsForms)
		}
		return ts, "", nil
	}
	var t time.Time
	if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, "", fmt.Errorf("%q: %s", s, tsForms)
		}
		if d >= 0 {
			return 0, "", fmt.Errorf("%q: a duration must be negative, a time ago (-15m)", s)
		}
		t, form = now.Add(d), "duration"
	} else {
		t, err = time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, "", fmt.Errorf("%q: %s", s, tsForms)
		}
		form = "time"
	}
	ms := t.UnixMilli()
	if ms <= 0 || ms >= 1<<46 {
		return 0, "", fmt.Errorf("%q: %s is outside the range of a TSO", s, t.UTC().Format(time.RFC3339))
	}
	return event.ComposeTS(ms, 1<<18-1), form, nil
}
