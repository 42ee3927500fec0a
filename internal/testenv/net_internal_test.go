package testenv

import (
	"errors"
	"testing"
)

// OnPorts tries another port after a failed start, up to its limit, and
// stops at once on an error marked StopTrying, returning it unmarked.
func TestOnPortsRetriesAndStops(t *testing.T) {
	next := 100
	pick := func() (int, error) { next++; return next, nil }
	taken := errors.New("address already in use")
	var seen []int
	err := OnPorts(pick, func(port int) error {
		seen = append(seen, port)
		if len(seen) < 3 {
			return taken
		}
		return nil
	})
	if err != nil || len(seen) != 3 || seen[0] == seen[1] {
		t.Fatalf("taken twice, then free: %v after ports %v; want nil after 3 different ports", err, seen)
	}
	seen = nil
	if err := OnPorts(pick, func(port int) error { seen = append(seen, port); return taken }); !errors.Is(err, taken) || len(seen) != portTries {
		t.Fatalf("always taken: %v after %d ports; want the last error after %d", err, len(seen), portTries)
	}
	seen = nil
	broken := errors.New("bad flag")
	err = OnPorts(pick, func(port int) error { seen = append(seen, port); return StopTrying(broken) })
	if err != broken || len(seen) != 1 {
		t.Fatalf("StopTrying: %v after %d ports; want the bad flag error itself after 1", err, len(seen))
	}
}
