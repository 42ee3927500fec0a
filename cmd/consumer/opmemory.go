package main

import (
	"flag"
	"os"
	"runtime/debug"

	"github.com/flowlog/flowlog/internal/cli"
)

// opMemory is --max-memory of the operator commands that read metas
// without sorting anything (verify, gc, flows): metas are streamed (one
// file entry at a time, an element of at most a few MiB), so what they hold
// is the Go runtime, the streams at once and what they summarise. The flag
// is the Go soft memory limit (unless GOMEMLIMIT is set) and sets how many
// metas and chunks are read at once.
type opMemory struct {
	Max cli.Size
}

// streamMemory is what one streamed meta or checked chunk may hold at most:
// a list element of a meta (4 MiB) and the decoder buffers behind it, or a
// zstd decoder with its largest window.
const streamMemory = 16 << 20

func (m *opMemory) RegisterFlags(f *flag.FlagSet) {
	m.Max = 256 << 20
	f.Var(&m.Max, "max-memory", "memory to stay within: the Go soft memory limit unless GOMEMLIMIT is set, and how many metas and chunks are read at once")
}

// apply sets the Go soft memory limit to --max-memory unless GOMEMLIMIT is
// set.
func (m *opMemory) apply() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(int64(m.Max))
	}
}

// streams is how many metas or chunks may be read at once within
// --max-memory, at least 1 and at most limit: a quarter of the budget goes
// to them.
func (m *opMemory) streams(limit int) int {
	return min(max(int(int64(m.Max)/4/streamMemory), 1), limit)
}
