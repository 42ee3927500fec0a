package sink

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/flowlog/flowlog/event"
)

// VerifyReport is the result of Verify. Faults lists every problem found, one
// sentence each; a backup is sound when there are none.
type VerifyReport struct {
	Metas            int    `json:"metas"`
	DataObjects      int    `json:"data_objects"`
	Chunks           int    `json:"chunks"`
	ChunkBytes       int64  `json:"chunk_bytes"` // uncompressed bytes checked
	CheckpointObject string `json:"checkpoint_object,omitempty"`
	CheckpointTS     uint64 `json:"checkpoint_ts"` // read from the object
	RedisCheckpoint  uint64 `json:"redis_checkpoint_ts"`
	// OtherCheckpoints are the global_checkpoint objects of other consumer
	// groups, listed when CheckpointObject is missing.
	OtherCheckpoints []string `json:"other_checkpoint_objects,omitempty"`
	// Unreferenced counts the objects under the flow's directory, outside
	// global_checkpoint/, that no listed meta references (of this flow, or
	// of another flow id that used the same name): leftovers of fenced or
	// crashed cycles, or a cycle being committed while verify ran. They are
	// not faults.
	Unreferenced      int      `json:"unreferenced_objects"`
	UnreferencedBytes int64    `json:"unreferenced_bytes"`
	Faults            []string `json:"faults"`
	SnapshotReport
}

// OK reports whether no fault was found.
func (r *VerifyReport) OK() bool { return len(r.Faults) == 0 }

func (r *VerifyReport) fault(format string, args ...any) {
	r.Faults = append(r.Faults, fmt.Sprintf(format, args...))
}

// VerifyOptions says which backup Verify checks.
type VerifyOptions struct {
	// Bucket holds the backup.
	Bucket Bucket
	// Flow is the flow checked; its metas must belong to it (see Flow).
	Flow Flow
	// MetaPaths are the flow's committed meta objects (metas:<flow_id>).
	MetaPaths []string
	// Group names the checkpoint object checked against RedisCheckpoint;
	// empty skips that check (a dropped flow has no checkpoint in Redis).
	Group           string
	RedisCheckpoint uint64
	// ListedMetas returns the committed meta paths of another flow id. A
	// flow id whose metas lie in this flow's directory is a dropped flow
	// of the same name: objects its listed metas reference are not
	// counted as unreferenced. Nil counts them.
	ListedMetas func(ctx context.Context, id uint32) ([]string, error)
	// ListedSnapshots returns the listed snapshot.meta paths of another
	// flow id (snapshots:<id>): the objects of those snapshots, in this
	// flow's directory when that id is a dropped flow of the same name, are
	// not counted as unreferenced. Nil counts them.
	ListedSnapshots func(ctx context.Context, id uint32) ([]string, error)
	// Snapshots are the flow's listed snapshots (snapshots:<flow_id>),
	// checked too (see SnapshotReport); their objects are referenced.
	Snapshots []SnapshotRef
}

// Verify checks a flow's backup: every meta in o.MetaPaths exists, decodes
// and belongs to o.Flow, every data object they reference exists, every
// chunk lies inside its object, matches its sha256 and frames into
// number_of_entries entries of sane size, no two metas cover the same
// offsets of a Kafka partition (which would mean an event backed up twice),
// and the checkpoint object of o.Group, if given, holds o.RedisCheckpoint.
// It also counts the unreferenced objects under the flow's directory.
// Problems are Faults in the report; the error is for failures to check at
// all (such as a cancelled ctx or an unreachable store).
func Verify(ctx context.Context, o VerifyOptions) (VerifyReport, error) {
	r := VerifyReport{RedisCheckpoint: o.RedisCheckpoint, Faults: []string{}}
	if err := o.Flow.validate(); err != nil {
		return r, fmt.Errorf("verify: %w", err)
	}
	b := o.Bucket
	if o.Group != "" {
		r.CheckpointObject = CheckpointPath(o.Flow.Prefix, o.Flow.Catalog, o.Flow.Name, o.Group, o.Flow.ID)
	}
	type covered struct {
		OffsetRange
		meta string
	}
	ranges := map[string][]covered{}
	referenced := map[string]bool{}
	var jobs []chunkJob
	for _, mp := range o.MetaPaths {
		referenced[mp] = true
		m, err := readFlowMeta(ctx, b, o.Flow, mp)
		if err != nil {
			if !isDataFault(err) {
				return r, err
			}
			r.fault("meta %s: %v", mp, errors.Unwrap(err))
			continue
		}
		r.Metas++
		referenced[m.DataPath] = true
		for _, o := range m.Offsets {
			k := fmt.Sprintf("%s/%d", o.Topic, o.Partition)
			ranges[k] = append(ranges[k], covered{o, mp})
		}
		if len(m.Files) == 0 {
			continue
		}
		size, err := b.Size(ctx, m.DataPath)
		if errors.Is(err, ErrNotExist) {
			r.fault("data object %s of meta %s is missing", m.DataPath, mp)
			continue
		}
		if err != nil {
			return r, err
		}
		r.DataObjects++
		for i, f := range m.Files {
			if f.Offset+f.Length > size {
				r.fault("chunk %d of %s: range [%d, %d) exceeds the object's %d bytes", i, m.DataPath, f.Offset, f.Offset+f.Length, size)
				continue
			}
			f.StartKey, f.EndKey = "", ""
			jobs = append(jobs, chunkJob{path: m.DataPath, index: i, f: f})
		}
	}
	for k, cs := range ranges {
		slices.SortFunc(cs, func(a, b covered) int {
			if a.From != b.From {
				return int(a.From - b.From)
			}
			return int(a.To - b.To)
		})
		widest := 0 // the range reaching furthest so far
		for i := 1; i < len(cs); i++ {
			w := cs[widest]
			if cs[i].From < w.To && cs[i].From < cs[i].To {
				r.fault("offsets of %s overlap: [%d, %d) in %s and [%d, %d) in %s", k,
					w.From, w.To, w.meta, cs[i].From, cs[i].To, cs[i].meta)
			}
			if cs[i].To > w.To {
				widest = i
			}
		}
	}
	slices.Sort(r.Faults) // map order above; keep reports stable

	n := len(r.Faults)
	if err := verifyChunks(ctx, b, jobs, &r); err != nil {
		return r, err
	}
	slices.Sort(r.Faults[n:]) // in the order the workers finished
	n = len(r.Faults)
	if err := verifySnapshots(ctx, o, referenced, &r); err != nil {
		return r, err
	}
	slices.Sort(r.Faults[n:])
	objs, err := listFlowObjects(ctx, b, o.Flow)
	if err != nil {
		return r, err
	}
	if r.CheckpointObject != "" {
		if err := verifyCheckpoint(ctx, b, r.CheckpointObject, objs.checkpoints, &r); err != nil {
			return r, err
		}
	}
	if err := countUnreferenced(ctx, o, objs.others, referenced, &r); err != nil {
		return r, err
	}
	return r, nil
}

// isDataFault tells a problem with the backup's content (a missing,
// undecodable or foreign meta) from a failure to read it.
func isDataFault(err error) bool {
	var be *badMetaError
	return errors.Is(err, ErrNotExist) || errors.As(err, &be)
}

func verifyChunks(ctx context.Context, b Bucket, jobs []chunkJob, r *VerifyReport) error {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		ferr error
		next = make(chan chunkJob)
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				n, err := checkChunk(ctx, b, j)
				mu.Lock()
				var ce *ChecksumError
				switch {
				case err == nil:
					r.Chunks++
					r.ChunkBytes += n
				case errors.As(err, &ce), errors.Is(err, ErrNotExist):
					r.fault("%v", err)
				case ferr == nil:
					ferr = err
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		if ctx.Err() != nil {
			break
		}
		next <- j
	}
	close(next)
	wg.Wait()
	if ferr != nil {
		return ferr
	}
	return ctx.Err()
}

// checkChunk reads a chunk through, checking its sha256 and that its bytes
// frame into number_of_entries entries of at most
// event.DefaultMaxEntrySize bytes each; the entries are skipped, not held.
func checkChunk(ctx context.Context, b Bucket, j chunkJob) (int64, error) {
	rc, err := OpenChunk(ctx, b, j.path, j.index, j.f)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 64<<10)
	var (
		hdr     [4]byte
		pos     int64
		entries int64
	)
	frameErr := func(format string, args ...any) error {
		return &ChecksumError{Object: j.path, Chunk: j.index, Offset: j.f.Offset, Err: fmt.Errorf(format, args...)}
	}
	// A checksum error of the reader comes first; an end inside an entry
	// of a chunk whose sha256 matched is a framing fault.
	frameReadErr := func(err error) error {
		var ce *ChecksumError
		if !errors.As(err, &ce) && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
			return frameErr("chunk ends inside an entry")
		}
		return err
	}
	for {
		var size uint64 // key and value bytes of the entry so far
		start := pos
		for field := range 2 {
			n, err := io.ReadFull(br, hdr[:])
			if field == 0 && n == 0 && errors.Is(err, io.EOF) {
				// The reader returned io.EOF: the sha256 matched.
				if entries != j.f.NumberOfEntries {
					return pos, frameErr("chunk holds %d entries, its meta says %d", entries, j.f.NumberOfEntries)
				}
				return pos, nil
			}
			if err != nil {
				return pos, frameReadErr(err)
			}
			pos += int64(len(hdr))
			l := uint64(binary.LittleEndian.Uint32(hdr[:]))
			size += l
			switch {
			case start+minEntrySize+int64(size) > j.f.RawLength:
				return pos, frameErr("entry of %d bytes runs past the chunk's raw_length %d", size, j.f.RawLength)
			case size > event.DefaultMaxEntrySize:
				return pos, frameErr("entry of at least %d bytes exceeds %d MiB", size, event.DefaultMaxEntrySize>>20)
			}
			m, err := br.Discard(int(l))
			pos += int64(m)
			if err != nil {
				return pos, frameReadErr(err)
			}
		}
		entries++
	}
}

// verifyCheckpoint checks the checkpoint object name against Redis. If it
// is missing, the report names the other checkpoint objects of the flow's
// directory (others: of other groups, or of another flow id of the same
// name) instead: a --group other than the consumer's is the likely cause.
func verifyCheckpoint(ctx context.Context, b Bucket, name string, others []string, r *VerifyReport) error {
	rc, err := b.Get(ctx, name)
	if errors.Is(err, ErrNotExist) {
		r.OtherCheckpoints = slices.DeleteFunc(others, func(s string) bool { return s == name })
		switch {
		case len(r.OtherCheckpoints) > 0:
			r.fault("checkpoint object %s is missing (Redis has %d), but global_checkpoint/ holds %s: is --group the consumer's group?",
				name, r.RedisCheckpoint, strings.Join(r.OtherCheckpoints, ", "))
		case r.RedisCheckpoint != 0:
			r.fault("checkpoint object %s is missing, Redis has %d", name, r.RedisCheckpoint)
		}
		return nil
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, 64))
	if err != nil {
		return fmt.Errorf("read checkpoint %s: %w", name, err)
	}
	ts, err := DecodeCheckpoint(raw)
	if err != nil {
		r.fault("checkpoint object %s: %v", name, err)
		return nil
	}
	r.CheckpointTS = ts
	switch {
	case ts < r.RedisCheckpoint:
		r.fault("checkpoint object %s holds %d, behind Redis' %d", name, ts, r.RedisCheckpoint)
	case ts > r.RedisCheckpoint:
		r.fault("checkpoint object %s holds %d, ahead of Redis' %d: the checkpoint went backwards", name, ts, r.RedisCheckpoint)
	}
	return nil
}
