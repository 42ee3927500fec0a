package pipeline

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A fetch's size limit (FetchMaxBytes) counts the bytes a broker sends,
// which are compressed when the producer compressed its batches; franz-go
// decompresses every batch of a fetch as it reads it, and the records
// keep the decompressed bytes until they are handled. At 128 MiB the fetch
// share allows fetches of 10.7 MiB: a topic of text compressed tenfold by
// its producer would hold over 100 MiB per fetch, and a consumer was seen
// passing 400 MiB within half a second of its start on a zstd-compressed
// backlog. fetchSizer keeps the decompressed size of a fetch near the
// share instead: it learns the compression ratio from the batches fetched
// (kgo.HookFetchBatchRead) and asks for base/ratio bytes per fetch
// (kgo.Client.UpdateFetchMaxBytes).
//
// Until it has seen a batch it asks for firstFetchBytes: the ratio of a
// topic is not known before its first fetch, and the first fetch is the
// one that would otherwise hold base times the ratio. The estimate rises
// at once to any batch's ratio and falls back exponentially, by a factor
// of e per base bytes (a full fetch's worth) of compressed batches with a
// lower ratio: a topic whose data turns compressible is followed within
// one fetch, and one whose data stops compressing well gets its larger
// fetches back after some tens of megabytes. Fetches are never asked
// smaller than minFetchBytes (a broker returns at least one batch per
// fetch whatever the limit) nor larger than base.
type fetchSizer struct {
	base int32

	mu    sync.Mutex
	cl    *kgo.Client // nil until the client exists
	seen  bool        // a batch was read: ratio is an estimate
	ratio float64     // uncompressed / compressed bytes, at least 1
	cur   int32       // the limit last set
	onSet func(int32) // called with each new limit (a gauge), may be nil
}

const (
	firstFetchBytes = 256 << 10
	minFetchBytes   = 64 << 10
)

var _ kgo.HookFetchBatchRead = (*fetchSizer)(nil)

// newFetchSizer returns a sizer for fetches of base decompressed bytes;
// initial is the limit to create the client with.
func newFetchSizer(base int32, onSet func(int32)) (f *fetchSizer, initial int32) {
	f = &fetchSizer{base: base, ratio: 1, cur: min(base, firstFetchBytes), onSet: onSet}
	if onSet != nil {
		onSet(f.cur)
	}
	return f, f.cur
}

// setClient gives the sizer the client whose fetch limits it sets.
func (f *fetchSizer) setClient(cl *kgo.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cl = cl
	if f.seen {
		f.apply(true)
	}
}

// OnFetchBatchRead implements kgo.HookFetchBatchRead: it updates the
// ratio estimate from one fetched batch and the fetch limit from that.
func (f *fetchSizer) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	if m.CompressedBytes <= 0 || m.UncompressedBytes <= 0 {
		return
	}
	r := max(float64(m.UncompressedBytes)/float64(m.CompressedBytes), 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !f.seen:
		f.seen, f.ratio = true, r
	case r >= f.ratio:
		f.ratio = r
	default:
		w := min(float64(m.CompressedBytes)/float64(f.base), 1)
		f.ratio += (r - f.ratio) * w
	}
	f.apply(false)
}

// apply sets the fetch limit for the current estimate when it moved by
// more than a tenth (or force).
func (f *fetchSizer) apply(force bool) {
	want := f.limit()
	if f.cl == nil || !force && want > f.cur*9/10 && want < f.cur+f.cur/10 {
		return
	}
	f.cur = want
	f.cl.UpdateFetchMaxBytes(want, want)
	if f.onSet != nil {
		f.onSet(want)
	}
}

// limit is base over the estimated ratio, within [minFetchBytes, base].
func (f *fetchSizer) limit() int32 {
	want := int32(float64(f.base) / f.ratio)
	return min(max(want, min(minFetchBytes, f.base)), f.base)
}
