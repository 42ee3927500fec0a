package pipeline

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// flowUpload is one flow's share of a cycle: its files become one data
// object and one meta object. The data object is the flow's temp files back
// to back, each already its chunk (stored or zstd frames, see tempFile):
// they are sealed and never change, so every retry uploads the same bytes.
type flowUpload struct {
	flow  *meta.Flow
	files []*tempFile

	built       bool // meta, size and CRC32C known
	size        int64
	crc         uint32
	meta        sink.Meta
	dataPath    string
	metaPath    string
	minResolved uint64
	dataDone    bool
	metaDone    bool
}

func groupByFlow(files []*tempFile) []*flowUpload {
	by := map[meta.FlowID]*flowUpload{}
	var out []*flowUpload
	for _, tf := range files {
		fu := by[tf.key.flow]
		if fu == nil {
			fu = &flowUpload{flow: tf.flow}
			by[tf.key.flow] = fu
			out = append(out, fu)
		}
		fu.files = append(fu.files, tf)
	}
	slices.SortFunc(out, func(a, b *flowUpload) int { return cmp.Compare(a.flow.ID, b.flow.ID) })
	for _, fu := range out {
		slices.SortFunc(fu.files, func(a, b *tempFile) int {
			ka, kb := a.key, b.key
			return cmp.Or(
				cmp.Compare(ka.partition, kb.partition), cmp.Compare(ka.table, kb.table),
				cmp.Compare(ka.region, kb.region), cmp.Compare(ka.cf, kb.cf), cmp.Compare(ka.op, kb.op),
				boolCmp(ka.isMeta, kb.isMeta))
		})
	}
	return out
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// uploadAll uploads the objects of every flow of the cycle not uploaded yet,
// --upload-parallelism flows at a time. A flow whose upload fails counts a
// failed cycle; --fatal-after of them in a row make it fatal.
func (f *flusher) uploadAll(ctx context.Context, cyc *cycle) error {
	c := f.c
	sem := make(chan struct{}, c.cfg.UploadParallel)
	var wg sync.WaitGroup
	errs := make([]error, len(cyc.flows))
	for i, fu := range cyc.flows {
		if fu.dataDone && fu.metaDone {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = f.uploadFlow(ctx, cyc, fu)
		}()
	}
	wg.Wait()
	var failed []error
	for i, err := range errs {
		fu := cyc.flows[i]
		if err == nil {
			continue
		}
		failed = append(failed, err)
		f.c.fatal.failed(ctx, []*meta.Flow{fu.flow}, err)
	}
	return errors.Join(failed...)
}

func (f *flusher) uploadFlow(ctx context.Context, cyc *cycle, fu *flowUpload) error {
	c := f.c
	cat, name := fu.flow.Info.CatalogName, fu.flow.Info.FlowName
	if !fu.built {
		if err := f.buildFlow(cyc, fu); err != nil {
			return err
		}
	}
	if !fu.dataDone {
		body := newChunkReader(fu.files)
		err := c.d.Bucket.Upload(ctx, sink.Object{Name: fu.dataPath, Body: body, Size: fu.size, CRC32C: fu.crc})
		body.Close()
		if err := uploaded(ctx, c.d.Bucket, fu.dataPath, fu.size, fu.crc, err); err != nil {
			return fmt.Errorf("flow %s/%s: %w", cat, name, err)
		}
		fu.dataDone = true
		cyc.uploaded()
		c.m.objectBytes.Observe(float64(fu.size))
	}
	if !fu.metaDone {
		b, err := sink.EncodeMeta(fu.meta)
		if err != nil {
			return fmt.Errorf("flow %s/%s: encode meta: %w", cat, name, err)
		}
		err = c.d.Bucket.Upload(ctx, sink.Object{Name: fu.metaPath, Body: bytes.NewReader(b), Size: int64(len(b)), CRC32C: sink.CRC32C(b)})
		if err := uploaded(ctx, c.d.Bucket, fu.metaPath, int64(len(b)), sink.CRC32C(b), err); err != nil {
			return fmt.Errorf("flow %s/%s: %w", cat, name, err)
		}
		fu.metaDone = true
		cyc.uploaded()
	}
	return nil
}

// seal closes the cycle's temp files once and groups them by flow.
func (f *flusher) seal(cyc *cycle) error {
	if cyc.closed {
		return nil
	}
	start := time.Now()
	for _, tf := range cyc.files {
		if err := tf.close(); err != nil {
			return fmt.Errorf("%w: %w", ErrTempWrite, err)
		}
	}
	cyc.flows = groupByFlow(cyc.files)
	cyc.closed = true
	f.c.m.tempWrite.WithLabelValues("close").Observe(time.Since(start).Seconds())
	return nil
}

// buildFlow builds fu's meta and records the build's duration.
func (f *flusher) buildFlow(cyc *cycle, fu *flowUpload) error {
	start := time.Now()
	if err := f.build(cyc, fu); err != nil {
		return fmt.Errorf("flow %s/%s: build data object: %w", fu.flow.Info.CatalogName, fu.flow.Info.FlowName, err)
	}
	f.c.m.flushDuration.WithLabelValues("build").Observe(time.Since(start).Seconds())
	return nil
}

// errForeignObject is an upload's ErrExists for an object that is not the
// one this cycle wrote.
var errForeignObject = errors.New("object exists with other content")

// uploaded interprets the result err of uploading name (size bytes, CRC32C
// crc). ErrExists counts as success only when the stored object is this
// one: an earlier attempt of the cycle wrote it and only its answer was
// lost. Anything else stored under the name is an error, never taken as
// ours.
func uploaded(ctx context.Context, b sink.Bucket, name string, size int64, crc uint32, err error) error {
	if err == nil {
		return nil
	}
	if !errors.Is(err, sink.ErrExists) {
		return fmt.Errorf("upload %s: %w", name, err)
	}
	got, serr := b.Size(ctx, name)
	if serr != nil {
		return fmt.Errorf("upload %s: exists, and reading it back failed: %w", name, serr)
	}
	if got != size {
		return fmt.Errorf("upload %s: %w (%d bytes stored, %d ours)", name, errForeignObject, got, size)
	}
	rc, gerr := b.Get(ctx, name)
	if gerr != nil {
		return fmt.Errorf("upload %s: exists, and reading it back failed: %w", name, gerr)
	}
	defer rc.Close()
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	if _, cerr := io.Copy(h, rc); cerr != nil {
		return fmt.Errorf("upload %s: exists, and reading it back failed: %w", name, cerr)
	}
	if h.Sum32() != crc {
		return fmt.Errorf("upload %s: %w (CRC32C %08x stored, %08x ours)", name, errForeignObject, h.Sum32(), crc)
	}
	return nil
}

// build lays the flow's sealed temp files out as the chunks of its data
// object and fills in the meta object, the object's size and its CRC32C
// (combined from the files' own). A segment whose size on disk is not what
// was written to it lost bytes: ErrTempWrite.
func (f *flusher) build(cyc *cycle, fu *flowUpload) error {
	c := f.c
	cat, name := fu.flow.Info.CatalogName, fu.flow.Info.FlowName
	var off int64
	var crc uint32
	m := sink.Meta{Version: 1, Flow: name, FlowID: fu.flow.ID, StoreID: c.cfg.StoreID, CycleID: cyc.id}
	first := true
	var checked *segment
	for _, tf := range fu.files {
		if tf.seg != checked {
			if err := tf.seg.check(); err != nil {
				return err
			}
			checked = tf.seg
		}
		compression := sink.CompressionNone
		if tf.zstd {
			compression = sink.CompressionZstd
		}
		m.Files = append(m.Files, sink.FileMeta{
			Offset: off, Length: tf.stored, RawLength: tf.size, Compression: compression,
			SHA256: tf.sum, NumberOfEntries: tf.entries, MinTS: tf.minTS, MaxTS: tf.maxTS,
			ResolvedTS: tf.resolvedTS, MinBeginTSInDefaultCF: tf.beginTS(),
			StartKey: hex.EncodeToString(tf.minKey), EndKey: hex.EncodeToString(tf.maxKey),
			TableID: tf.key.table, RegionID: tf.key.region, CF: sink.CFName(tf.key.cf), Op: sink.OpName(tf.key.op),
			IsMeta: tf.key.isMeta, Partition: tf.key.partition,
		})
		off += tf.stored
		crc = sink.CombineCRC32C(crc, tf.crc, tf.stored)
		if first || tf.minTS < m.MinTS {
			m.MinTS = tf.minTS
		}
		if first || tf.maxTS > m.MaxTS {
			m.MaxTS = tf.maxTS
		}
		if first || tf.resolvedTS < m.MinResolvedTS {
			m.MinResolvedTS = tf.resolvedTS
		}
		first = false
	}
	for _, p := range cyc.parts {
		if p.to > p.from && p.from >= 0 {
			m.Offsets = append(m.Offsets, sink.OffsetRange{Topic: p.lease.Topic, Partition: p.lease.Partition, From: p.from, To: p.to})
		}
	}
	id := cyc.id
	if cyc.renames > 0 {
		id = fmt.Sprintf("%s-r%d", cyc.id, cyc.renames)
		m.CycleID = id
	}
	fu.dataPath = sink.DataPath(c.d.GCSPrefix, cat, name, fu.flow.ID, m.MinTS, id)
	fu.metaPath = sink.MetaPath(c.d.GCSPrefix, cat, name, fu.flow.ID, m.MinResolvedTS, id)
	m.DataPath = fu.dataPath
	fu.meta, fu.minResolved = m, m.MinResolvedTS
	fu.size, fu.crc, fu.built = off, crc, true
	return nil
}

// flowsOf returns the flows of the cycle's uploads.
func (cyc *cycle) flowsOf() []*meta.Flow {
	out := make([]*meta.Flow, len(cyc.flows))
	for i, fu := range cyc.flows {
		out[i] = fu.flow
	}
	return out
}
