package pipeline

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// --max-memory: its default and smallest value.
const (
	defaultMaxMemory = 128 << 20
	minMaxMemory     = 16 << 20
)

// Shares of --max-memory (divisors): what each consumer of memory that
// could otherwise grow with the backlog, the record size or the number of
// regions may hold at most. What is left is for the Go runtime, the Kafka,
// Redis and GCS clients and decoding; the shares are upper bounds that a
// load rarely reaches all at once. At the default 128 MiB the defaults of
// --max-open-files (384) and --max-cycle-files (10000) just fit.
const (
	// fetchShare bounds Kafka fetches: those in flight or buffered in the
	// client plus the one the consume loop is handling.
	fetchShare = 4
	// bufferShare bounds the write buffers of open temp files
	// (--max-open-files x tempBufSize). A tenth: with thousands of busy
	// files every buffer is in use at once, beside full fetches and an
	// upload, and a quarter put the heap over the Go memory limit, the
	// collector running every few MB allocated; at an eighth a wide row
	// still ran 120-150 collections, at 384 buffers (12 MiB) 66-71
	// (docs/SIZING.md, "Width: many flows, tables and regions (layout
	// v2)").
	bufferShare = 10
	// uploadShare bounds the flows uploading at once: each holds a GCS
	// chunk buffer while it uploads.
	uploadShare = 4
	// fileShare bounds the bookkeeping of temp files in the current and
	// in-flight cycles (2 x --max-cycle-files x fileOverhead).
	fileShare = 6
)

// maxConcurrentFetches is kgo.MaxConcurrentFetches: fetches in flight or
// buffered at once, across brokers. Two keep one fetch on the wire while
// the consume loop handles the previous one.
const maxConcurrentFetches = 2

// fetchMaxWait is how long a broker may hold a fetch that has no data yet
// (Kafka's fetch.max.wait.ms default; franz-go's is 5 s). With a bounded
// number of fetches an idle broker's long poll holds a slot, so it must
// end soon for a busy broker to get it.
const fetchMaxWait = 500 * time.Millisecond

// gcsChunkMax is the GCS client's chunk size flowlog used before
// --max-memory, and the largest upload chunk: larger chunks do not make
// uploads faster. gcsChunkMin is the smallest chunk GCS accepts; chunks are
// multiples of it.
const (
	gcsChunkMax = 16 << 20
	gcsChunkMin = 256 << 10
)

// nonHeapAllowance is the part of --max-memory left outside the Go
// runtime's soft limit: the process's resident code and read-only data,
// which the runtime does not count (about 40 MiB of the consumer's RSS was
// its binary when the limit was all of --max-memory, and peak RSS was
// 166-174 MiB at the default 128 MiB).
const nonHeapAllowance = 32 << 20

// GoMemoryLimit is the Go soft memory limit the consumer sets for a
// --max-memory of budget bytes (unless GOMEMLIMIT is set): the budget less
// nonHeapAllowance, and never less than half of it, so that the process as
// a whole, code included, stays near the budget.
func GoMemoryLimit(budget int64) int64 {
	return max(budget-nonHeapAllowance, budget/2)
}

// MemoryBudget is --max-memory in bytes, or its default when the Config
// leaves it zero.
func (c *Config) MemoryBudget() int64 {
	if c.MaxMemory <= 0 {
		return defaultMaxMemory
	}
	return int64(c.MaxMemory)
}

// fetchMaxBytes is kgo.FetchMaxBytes: the fetch share of --max-memory over
// the fetches it covers (maxConcurrentFetches plus the one being handled),
// and at most an eighth of --max-temp-bytes, since a poll's records (up to
// maxConcurrentFetches fetches) are all written before the --max-temp-bytes
// check pauses fetching: that bounds the overshoot to a quarter of it.
// At least 1 MiB, at most 64 MiB. A broker still returns a
// single record batch larger than this, and a compressed batch takes its
// uncompressed size once the client has decompressed it.
func (c *Config) fetchMaxBytes() int32 {
	n := c.MemoryBudget() / fetchShare / (maxConcurrentFetches + 1)
	n = min(n, int64(c.MaxTempBytes)/(4*maxConcurrentFetches))
	return int32(min(max(n, 1<<20), 64<<20))
}

// FetchOpts are the kgo options that bound the consumer's fetch memory
// from --max-memory: FetchMaxBytes and FetchMaxPartitionBytes (one
// partition may fill a fetch), MaxConcurrentFetches and FetchMaxWait. A
// client that should read like the consumer (the benchmark's raw consumer)
// can use them too.
func (c *Config) FetchOpts() []kgo.Opt {
	n := c.fetchMaxBytes()
	return []kgo.Opt{
		kgo.FetchMaxBytes(n),
		kgo.FetchMaxPartitionBytes(n),
		kgo.MaxConcurrentFetches(maxConcurrentFetches),
		kgo.FetchMaxWait(fetchMaxWait),
	}
}

// UploadChunkSize is the GCS chunk size that keeps --upload-parallelism
// uploads within the upload share of --max-memory: the GCS client buffers
// one chunk per upload of an object larger than a chunk. A multiple of 256
// KiB, from 256 KiB to 16 MiB.
func (c *Config) UploadChunkSize() int64 {
	n := c.MemoryBudget() / uploadShare / int64(max(c.UploadParallel, 1))
	n = n / gcsChunkMin * gcsChunkMin
	return min(max(n, gcsChunkMin), gcsChunkMax)
}

// applyMemoryLimits lowers MaxOpenFiles and MaxCycleFiles (defaults filled
// in by applyFileLimits) so that their memory fits the shares of
// --max-memory, and logs the plan.
func (c *Config) applyMemoryLimits(log *slog.Logger) {
	m := c.MemoryBudget()
	if n := int(max(m/bufferShare/tempBufSize, 1)); c.MaxOpenFiles > n {
		log.Info("--max-open-files lowered to fit the temp file buffers in --max-memory", "max_open_files", n,
			"flag", c.MaxOpenFiles, "max_memory", m)
		c.MaxOpenFiles = n
	}
	if n := int(max(m/fileShare/(2*fileOverhead), 1)); c.MaxCycleFiles > n {
		log.Info("--max-cycle-files lowered to fit the temp file bookkeeping in --max-memory", "max_cycle_files", n,
			"flag", c.MaxCycleFiles, "max_memory", m)
		c.MaxCycleFiles = n
	}
	log.Info("memory plan", "max_memory", m, "fetch_max_bytes", c.fetchMaxBytes(),
		"max_concurrent_fetches", maxConcurrentFetches, "max_open_files", c.MaxOpenFiles,
		"max_cycle_files", c.MaxCycleFiles, "upload_chunk_bytes", c.UploadChunkSize())
}
