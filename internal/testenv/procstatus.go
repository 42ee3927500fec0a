package testenv

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcStatus reads the kB fields named (without the colon: "VmHWM",
// "VmRSS", "RssAnon") from /proc/<pid>/status in one read and returns them
// in bytes. It fails when the process is gone (or the system has no /proc)
// or a field is missing or not a number; the map is then nil, so that a
// caller to whom a gone process counts as zero may index it anyway.
func ProcStatus(pid int, fields ...string) (map[string]int64, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want := make(map[string]bool, len(fields))
	for _, name := range fields {
		want[name] = true
	}
	out := make(map[string]int64, len(fields))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !want[name] {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", path, name, err)
		}
		out[name] = kb << 10
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) < len(want) {
		return nil, fmt.Errorf("%s lacks %d of %s", path, len(want)-len(out), strings.Join(fields, ", "))
	}
	return out, nil
}
