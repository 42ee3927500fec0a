package pipeline

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// Building a cycle's objects (docs/FORMAT.md, "Data objects and chunks",
// "Meta objects", "Layout v2"). The chunks of a data object are its temp
// files in key order: partition, table, region, cf, op, is_meta, and in
// layout v2 (whose keys have no region) the flow set, then the split of a
// key whose region runs filled a file. The meta lists them at their
// offsets, with the cycle's Kafka offset ranges; a layout v2 meta also
// names its flows and carries what the cycle's commit writes of the
// partitions and coverage.

// groupByFlow lays out a layout v1 cycle: one upload per flow, by flow id.
func groupByFlow(files []*tempFile) (uploads []*upload, flows []*meta.Flow) {
	by := map[meta.FlowID]*upload{}
	for _, tf := range files {
		u := by[tf.key.flow]
		if u == nil {
			u = &upload{flow: tf.flow}
			by[tf.key.flow] = u
			uploads = append(uploads, u)
		}
		u.files = append(u.files, tf)
	}
	slices.SortFunc(uploads, func(a, b *upload) int { return cmp.Compare(a.flow.ID, b.flow.ID) })
	for _, u := range uploads {
		sortFiles(u.files)
		flows = append(flows, u.flow)
	}
	return uploads, flows
}

// groupV2 lays out a layout v2 cycle: one upload of every file, or none
// when the cycle has neither files nor coverage reports (its partition
// progress is committed all the same). The flows are those with a chunk.
func groupV2(cyc *cycle) (uploads []*upload, flows []*meta.Flow) {
	seen := map[meta.FlowID]bool{}
	for _, tf := range cyc.files {
		for _, fl := range tf.key.set.Flows {
			if !seen[fl.ID] {
				seen[fl.ID] = true
				flows = append(flows, fl)
			}
		}
	}
	slices.SortFunc(flows, func(a, b *meta.Flow) int { return cmp.Compare(a.ID, b.ID) })
	if len(cyc.files) == 0 && len(cyc.coverage) == 0 {
		return nil, flows
	}
	files := slices.Clone(cyc.files)
	sortFiles(files)
	return []*upload{{files: files}}, flows
}

// sortFiles orders files by key.
func sortFiles(files []*tempFile) {
	slices.SortFunc(files, func(a, b *tempFile) int {
		ka, kb := a.key, b.key
		return cmp.Or(
			cmp.Compare(ka.partition, kb.partition), cmp.Compare(ka.table, kb.table),
			cmp.Compare(ka.region, kb.region), cmp.Compare(ka.cf, kb.cf), cmp.Compare(ka.op, kb.op),
			boolCmp(ka.isMeta, kb.isMeta), setCmp(ka.set, kb.set), cmp.Compare(ka.split, kb.split))
	})
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

func setCmp(a, b *meta.FlowSet) int {
	if a == nil || b == nil {
		return boolCmp(a != nil, b != nil)
	}
	return slices.Compare(a.IDs, b.IDs)
}

// build lays u's sealed temp files out as the chunks of its data object and
// fills in its meta, the object's size, CRC32C (combined from the files'
// own) and names. A segment whose size on disk is not what was written to
// it lost bytes: ErrTempWrite.
func (f *flusher) build(cyc *cycle, u *upload) error {
	start := time.Now()
	c := f.c
	m := sink.Meta{Version: sink.MetaVersion, StoreID: c.cfg.StoreID, Files: make([]sink.FileMeta, 0, len(u.files))}
	if u.flow != nil {
		m.Flow, m.FlowID = u.flow.Info.FlowName, u.flow.ID
	} else {
		m.Version, m.Group = sink.MetaVersion2, c.d.Group
	}
	var off int64
	var crc uint32
	checked := map[*segment]bool{}
	for i, tf := range u.files {
		for _, seg := range []*segment{tf.seg, tf.pack} {
			if seg == nil || checked[seg] {
				continue
			}
			if err := seg.check(); err != nil {
				return fmt.Errorf("%s: build data object: %w", u.what(), err)
			}
			checked[seg] = true
		}
		fm := fileEntry(tf, off)
		m.Files = append(m.Files, fm)
		off += tf.stored
		crc = sink.CombineCRC32C(crc, tf.crc, tf.stored)
		if i == 0 || tf.minTS < m.MinTS {
			m.MinTS = tf.minTS
		}
		if i == 0 || tf.maxTS > m.MaxTS {
			m.MaxTS = tf.maxTS
		}
		if i == 0 || tf.resolvedTS < m.MinResolvedTS {
			m.MinResolvedTS = tf.resolvedTS
		}
	}
	for _, p := range cyc.parts {
		if p.to > p.from && p.from >= 0 {
			m.Offsets = append(m.Offsets, sink.OffsetRange{Topic: p.lease.Topic, Partition: p.lease.Partition, From: p.from, To: p.to})
		}
	}
	if u.flow == nil {
		f.buildV2(cyc, &m)
	}
	u.meta, u.size, u.crc, u.built = m, off, crc, true
	u.dataDone = len(u.files) == 0 // a meta of coverage reports only
	f.name(cyc, u)
	c.m.flushDuration.WithLabelValues("build").Observe(time.Since(start).Seconds())
	return nil
}

// fileEntry is fileMeta without the region runs of a chunk of several
// regions (addRuns): an upload holds its meta from the build until the
// commit, while the runs, decoded, are 16 bytes each (tens of MB for a
// cycle whose chunks every region writes to) and are needed only while
// the meta is encoded (encodeMeta).
func fileEntry(tf *tempFile, off int64) sink.FileMeta {
	compression := sink.CompressionNone
	if tf.zstd {
		compression = sink.CompressionZstd
	}
	fm := sink.FileMeta{
		Offset: off, Length: tf.stored, RawLength: tf.size, Compression: compression,
		SHA256: tf.sum, NumberOfEntries: tf.entries, MinTS: tf.minTS, MaxTS: tf.maxTS,
		ResolvedTS: tf.resolvedTS, MinBeginTSInDefaultCF: tf.beginTS(),
		StartKey: hex.EncodeToString(tf.minKey), EndKey: hex.EncodeToString(tf.maxKey),
		TableID: tf.key.table, RegionID: tf.key.region, CF: sink.CFName(tf.key.cf), Op: sink.OpName(tf.key.op),
		IsMeta: tf.key.isMeta, Partition: tf.key.partition,
	}
	if tf.key.set != nil {
		if len(tf.parts) > 0 {
			fm.Partition = tf.parts[0] // of its first entry; it may hold others'
		}
		fm.FlowIDs = tf.key.set.IDs // ascending, and never changed
		// A chunk of one region says it in region_id, as before chunks
		// held several; one of several lists their runs, region_id 0.
		if tf.runs.len() == 1 {
			fm.RegionID = tf.runs.last.Region
		}
	}
	return fm
}

// addRuns lists the region runs of tf's chunk in its meta entry fm when
// the chunk holds several regions (region_id 0): the runs spilled at the
// freeze are read from its segment through files, and a failed read is
// kept in readErr.
func addRuns(fm *sink.FileMeta, tf *tempFile, files *segFiles, readErr *error) {
	if tf.key.set != nil && tf.runs.len() > 1 {
		fm.SetRegionRuns(runSource{l: &tf.runs, seg: tf.seg, files: files, err: readErr})
	}
}

// encodeMeta encodes u's meta with the region runs of its chunks, which
// are listed only for as long as this takes (fileEntry). Runs that cannot
// be read back from the temp dir fail it (ErrTempWrite).
func encodeMeta(u *upload) ([]byte, error) {
	var files segFiles
	defer files.close()
	var readErr error
	for i, tf := range u.files {
		addRuns(&u.meta.Files[i], tf, &files, &readErr)
	}
	defer func() {
		for i := range u.meta.Files {
			u.meta.Files[i].SetRegionRuns(nil)
		}
	}()
	b, err := sink.EncodeMeta(u.meta)
	if readErr != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrTempWrite, u.what(), readErr)
	}
	return b, err
}

// buildV2 fills in what only a layout v2 meta has: its flows (every flow
// with a chunk or a coverage report, named as when the cycle was frozen),
// the partition states and the coverage reports its commit writes. A meta
// without files takes the lowest partition checkpoint of the cycle as its
// min_resolved_ts, so that it lists among the metas of its time.
func (f *flusher) buildV2(cyc *cycle, m *sink.Meta) {
	named := map[meta.FlowID]bool{}
	for _, fl := range cyc.flows {
		named[fl.ID] = true
		m.Flows = append(m.Flows, sink.MetaFlow{FlowID: fl.ID, Catalog: fl.Info.CatalogName, Name: fl.Info.FlowName})
	}
	for _, r := range cyc.coverage {
		if named[r.FlowID] {
			continue
		}
		named[r.FlowID] = true
		mf := sink.MetaFlow{FlowID: r.FlowID}
		if fl := cyc.covFlows[r.FlowID]; fl != nil {
			mf.Catalog, mf.Name = fl.Info.CatalogName, fl.Info.FlowName
		}
		m.Flows = append(m.Flows, mf)
	}
	slices.SortFunc(m.Flows, func(a, b sink.MetaFlow) int { return cmp.Compare(a.FlowID, b.FlowID) })
	first := true
	m.Partitions = make([]sink.PartitionState, 0, len(cyc.parts))
	for _, p := range cyc.parts {
		ps := sink.PartitionState{Topic: p.lease.Topic, Partition: p.lease.Partition, NextOffset: p.to,
			Checkpoint: p.ckpt, HasCheckpoint: p.hasCkpt, Idle: p.idle && !p.hasCkpt, MaxTS: p.maxTS}
		if len(p.regions) > 0 {
			ps.Regions = make(map[string]uint64, len(p.regions))
			for r, ts := range p.regions {
				ps.Regions[strconv.FormatUint(r, 10)] = ts
			}
		}
		m.Partitions = append(m.Partitions, ps)
		if len(m.Files) == 0 && p.hasCkpt && (first || p.ckpt < m.MinResolvedTS) {
			m.MinResolvedTS, first = p.ckpt, false
		}
	}
	for _, r := range cyc.coverage {
		m.Coverage = append(m.Coverage, sink.CoverageReport{FlowID: r.FlowID, Seq: r.Seq, Topic: r.Topic,
			Partition: r.Partition, Since: sink.CoverageValue{TS: r.Since.TS, Idle: r.Since.Idle},
			Until: sink.CoverageValue{TS: r.Until.TS, Idle: r.Until.Idle}, Upto: max(r.Upto, r.Seq)})
	}
}

// name gives u's objects their names from its meta and rename count.
func (f *flusher) name(cyc *cycle, u *upload) {
	c := f.c
	id := retryName(cyc.id, u.renames)
	u.meta.CycleID = id
	if u.flow != nil {
		cat, name := u.flow.Info.CatalogName, u.flow.Info.FlowName
		u.dataPath = sink.DataPath(c.d.GCSPrefix, cat, name, u.flow.ID, u.meta.MinTS, id)
		u.metaPath = sink.MetaPath(c.d.GCSPrefix, cat, name, u.flow.ID, u.meta.MinResolvedTS, id)
	} else {
		u.dataPath = sink.DataPathV2(c.d.GCSPrefix, c.cfg.StoreID, u.meta.MinTS, id)
		u.metaPath = sink.MetaPathV2(c.d.GCSPrefix, c.cfg.StoreID, u.meta.MinResolvedTS, id)
	}
	u.meta.DataPath = u.dataPath
	if len(u.files) == 0 {
		u.meta.DataPath = ""
	}
}
