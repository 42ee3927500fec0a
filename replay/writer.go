package replay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
)

// RunID is the id of a replay with these arguments (the flow, the mode,
// the resolved from and to ts, the tables and key range, and the format):
// the same arguments give the same id and, the backup being the same, the
// same records in the same order. A run's records carry it, so that a
// re-run finds what an interrupted one wrote. The target is not part of
// it: a run reads only its own topic's tail, and two targets of one replay
// hold the same records, headers included.
func RunID(flowID uint32, mode Mode, from, to uint64, tables []int64, startKey, endKey []byte, format Format) string {
	var b strings.Builder
	fmt.Fprintf(&b, "flowlog-replay v1\nflow=%d\nmode=%s\nfrom=%d\nto=%d\nformat=%s\ntables=", flowID, mode, from, to, format)
	for i, t := range tables {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(t, 10))
	}
	if len(startKey) > 0 || len(endKey) > 0 {
		fmt.Fprintf(&b, "\nkeys=%x-%x", startKey, endKey)
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}

// runHeader is the HeaderRun value of a run.
func runHeader(flowID uint32, run string) string { return fmt.Sprintf("flow=%d run=%s", flowID, run) }

// maxBatchEvents bounds the event bytes of one record: a region's events
// of a chunk go in records of about this much (one larger event goes
// alone), well under Kafka's default 1 MiB message limit.
const maxBatchEvents = 256 << 10

// writer numbers the run's records, skips those an earlier run wrote, and
// sends the rest to the target at the rate allowed.
type writer struct {
	t       Target
	parts   int32
	written map[int32]int64
	header  []byte
	json    bool
	lim     *limiter
	seq     int64
	res     *Result
	regions map[uint64]bool
}

// send writes b as the run's next record.
func (w *writer) send(ctx context.Context, b *event.Batch) error {
	seq := w.seq
	w.seq++
	w.regions[b.RegionID] = true
	key := strconv.AppendUint(nil, b.RegionID, 10)
	p := partition(key, w.parts)
	if last, ok := w.written[p]; ok && seq <= last {
		w.res.Skipped++
		return nil
	}
	var value []byte
	if w.json {
		v, err := event.EncodeBatchJSON(b)
		if err != nil {
			return err
		}
		value = v
	} else {
		value = event.EncodeBatch(nil, b)
	}
	hs := []kgo.RecordHeader{
		{Key: HeaderRun, Value: w.header},
		{Key: HeaderSeq, Value: strconv.AppendInt(nil, seq, 10)},
	}
	if w.json {
		hs = append(hs, kgo.RecordHeader{Key: "content-type", Value: []byte("application/json")})
	}
	r := &kgo.Record{Key: key, Value: value, Partition: p, Headers: hs}
	n := recordSize(r)
	if err := w.lim.wait(ctx, n); err != nil {
		return err
	}
	if err := w.t.Produce(ctx, r); err != nil {
		return err
	}
	w.res.Records++
	w.res.Bytes += int64(n)
	return nil
}

// recordSize is the bytes of r the rate counts: key, value and headers.
func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// partition is Kafka's default partitioner for a keyed record (murmur2 of
// the key, positive, modulo the partition count), so that a region's
// records go where any Kafka client would send them.
func partition(key []byte, n int32) int32 {
	return int32((murmur2(key) & 0x7fffffff) % uint32(n))
}

func murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		b = b[4:]
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// sortedRegions returns the keys of m in order.
func sortedRegions(m map[uint64]uint64) []uint64 {
	out := make([]uint64, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}
