package sink

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
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
// chunk of the flow lies inside its object, matches its sha256 and frames
// into number_of_entries entries of sane size, no two metas cover the same
// offsets of a Kafka partition (which would mean an event backed up twice),
// and the checkpoint object of o.Group, if given, holds o.RedisCheckpoint.
// It also counts the unreferenced objects under the flow's directory.
// Problems are Faults in the report; the error is for failures to check at
// all (such as a cancelled ctx or an unreachable store).
func Verify(ctx context.Context, o VerifyOptions) (VerifyReport, error) {
	rs, err := VerifyFlows(ctx, o.Bucket, []VerifyOptions{o}, 4)
	if len(rs) == 0 {
		return VerifyReport{RedisCheckpoint: o.RedisCheckpoint, Faults: []string{}}, err
	}
	return rs[0], err
}

// VerifyFlows verifies several flows as Verify does one, reporting per
// flow (in the order of flows), but reads and checks each meta and chunk
// once however many of the flows list it: a layout v2 cycle serves every
// flow it routed for. A fault of a shared meta or chunk is reported for
// every flow that reads it. Each VerifyOptions' Bucket is ignored; parallel
// chunks are checked at once.
func VerifyFlows(ctx context.Context, b Bucket, flows []VerifyOptions, parallel int) ([]VerifyReport, error) {
	rs := make([]VerifyReport, len(flows))
	for i, o := range flows {
		rs[i] = VerifyReport{RedisCheckpoint: o.RedisCheckpoint, Faults: []string{}}
		if err := o.Flow.validate(); err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
	}
	v := &verifier{b: b, flows: flows, rs: rs, parallel: max(parallel, 1), ranges: make([]map[string][]covered, len(flows)), referenced: make([]map[string]bool, len(flows))}
	for i := range flows {
		v.ranges[i], v.referenced[i] = map[string][]covered{}, map[string]bool{}
	}
	if err := v.metasAndChunks(ctx); err != nil {
		return rs, err
	}
	for i, o := range flows {
		o.Bucket = b
		r := &rs[i]
		n := len(r.Faults)
		if err := verifySnapshots(ctx, o, v.referenced[i], r); err != nil {
			return rs, err
		}
		slices.Sort(r.Faults[n:])
		objs, err := listFlowObjects(ctx, b, o.Flow)
		if err != nil {
			return rs, err
		}
		if o.Group != "" {
			if err := verifyCheckpoint(ctx, b, o.Flow, o.Group, objs.checkpoints, r); err != nil {
				return rs, err
			}
		}
		if err := countUnreferenced(ctx, o, objs.others, v.referenced[i], r); err != nil {
			return rs, err
		}
	}
	return rs, nil
}

// covered is an offset range of a meta.
type covered struct {
	OffsetRange
	meta string
}

// verifier is one VerifyFlows run's state: per flow, its report, the offset
// ranges of its metas, the objects they reference, and the faults of its
// metas and of its chunks (sorted apart: they are found concurrently).
type verifier struct {
	b          Bucket
	parallel   int
	flows      []VerifyOptions
	rs         []VerifyReport
	ranges     []map[string][]covered
	referenced []map[string]bool

	mu          sync.Mutex // guards rs and the faults while chunks are checked
	metaFaults  [][]string
	chunkFaults [][]string
}

func (v *verifier) fault(list [][]string, i int, format string, args ...any) {
	list[i] = append(list[i], fmt.Sprintf(format, args...))
}

// sharedJob is a chunk to check and the flows that read it.
type sharedJob struct {
	chunkJob
	flows []int
}

// metasAndChunks reads every listed meta once, in the order the flows list
// them, while workers check the chunks the metas name; then it checks the
// offset ranges of each flow's metas.
func (v *verifier) metasAndChunks(ctx context.Context) error {
	v.metaFaults, v.chunkFaults = make([][]string, len(v.flows)), make([][]string, len(v.flows))
	listers := map[string][]int{} // meta path -> flows listing it
	var paths []string
	for i, o := range v.flows {
		for _, mp := range o.MetaPaths {
			if _, ok := listers[mp]; !ok {
				paths = append(paths, mp)
			}
			if !slices.Contains(listers[mp], i) {
				listers[mp] = append(listers[mp], i)
			}
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		ferr error
		jobs = make(chan sharedJob, 64)
	)
	for range v.parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				n, err := checkChunk(cctx, v.b, j.chunkJob)
				var ce *ChecksumError
				bad := errors.As(err, &ce) || errors.Is(err, ErrNotExist)
				v.mu.Lock()
				for _, i := range j.flows {
					switch {
					case err == nil:
						v.rs[i].Chunks++
						v.rs[i].ChunkBytes += n
					case bad:
						v.fault(v.chunkFaults, i, "%v", err)
					}
				}
				if err != nil && !bad && ferr == nil {
					ferr = err
					cancel()
				}
				v.mu.Unlock()
			}
		}()
	}
	var merr error
	for _, mp := range paths {
		if merr = v.meta(cctx, mp, listers[mp], jobs); merr != nil || cctx.Err() != nil {
			break
		}
	}
	close(jobs)
	wg.Wait()
	switch {
	case merr != nil:
		return merr
	case ferr != nil:
		return ferr
	case ctx.Err() != nil:
		return ctx.Err()
	}
	for i := range v.rs {
		v.overlaps(i)
		slices.Sort(v.metaFaults[i])
		slices.Sort(v.chunkFaults[i])
		v.rs[i].Faults = append(append(v.rs[i].Faults, v.metaFaults[i]...), v.chunkFaults[i]...)
	}
	return nil
}

// meta reads meta mp, which the flows listers list, and sends the chunks
// they hold to the chunk workers.
func (v *verifier) meta(ctx context.Context, mp string, listers []int, jobs chan<- sharedJob) error {
	var (
		hdr    *Meta
		takers []int            // the listers whose meta it is
		holds  = map[int]bool{} // takers holding a chunk of it so far
		size   = int64(-1)      // of the data object, once looked up
		gone   bool
	)
	_, _, _, err := streamMeta(ctx, v.b, mp, metaParts{}, metaVisitor{
		header: func(m *Meta) error {
			hdr = m
			v.mu.Lock()
			defer v.mu.Unlock()
			for _, i := range listers {
				if err := v.flows[i].Flow.check(m); err != nil {
					v.fault(v.metaFaults, i, "meta %s: refused: %v", mp, err)
					continue
				}
				takers = append(takers, i)
				v.rs[i].Metas++
				v.referenced[i][mp] = true
				v.referenced[i][m.DataPath] = true
				for _, o := range m.Offsets {
					k := fmt.Sprintf("%s/%d", o.Topic, o.Partition)
					v.ranges[i][k] = append(v.ranges[i][k], covered{o, mp})
				}
			}
			if len(takers) == 0 {
				return errStopMeta
			}
			return nil
		},
		file: func(idx int, f *FileMeta) error {
			var holders []int
			for _, i := range takers {
				if hdr.Holds(v.flows[i].Flow.ID, f) {
					holders = append(holders, i)
				}
			}
			if len(holders) == 0 {
				return nil
			}
			if size < 0 && !gone {
				n, err := v.b.Size(ctx, hdr.DataPath)
				switch {
				case errors.Is(err, ErrNotExist):
					gone = true
				case err != nil:
					return err
				}
				size = n
			}
			v.mu.Lock()
			for _, i := range holders {
				if !holds[i] {
					holds[i] = true
					if gone {
						v.fault(v.metaFaults, i, "data object %s of meta %s is missing", hdr.DataPath, mp)
					} else {
						v.rs[i].DataObjects++
					}
				}
				if !gone && f.Offset+f.Length > size {
					v.fault(v.metaFaults, i, "chunk %d of %s: range [%d, %d) exceeds the object's %d bytes", idx, hdr.DataPath, f.Offset, f.Offset+f.Length, size)
				}
			}
			v.mu.Unlock()
			if gone || f.Offset+f.Length > size {
				return nil
			}
			j := sharedJob{chunkJob: chunkJob{path: hdr.DataPath, index: idx, f: *f}, flows: holders}
			j.f.FlowIDs = nil
			select {
			case jobs <- j:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	if err != nil && isDataFault(err) {
		v.mu.Lock()
		for _, i := range listers {
			v.fault(v.metaFaults, i, "meta %s: %v", mp, errors.Unwrap(err))
		}
		v.mu.Unlock()
		return nil
	}
	return err
}

// overlaps reports the offsets that two of flow i's metas both cover.
func (v *verifier) overlaps(i int) {
	for k, cs := range v.ranges[i] {
		slices.SortFunc(cs, func(a, b covered) int {
			if a.From != b.From {
				return int(a.From - b.From)
			}
			return int(a.To - b.To)
		})
		widest := 0 // the range reaching furthest so far
		for j := 1; j < len(cs); j++ {
			w := cs[widest]
			if cs[j].From < w.To && cs[j].From < cs[j].To {
				v.fault(v.metaFaults, i, "offsets of %s overlap: [%d, %d) in %s and [%d, %d) in %s", k,
					w.From, w.To, w.meta, cs[j].From, cs[j].To, cs[j].meta)
			}
			if cs[j].To > w.To {
				widest = j
			}
		}
	}
}

// isDataFault tells a problem with the backup's content (a missing,
// undecodable or foreign meta) from a failure to read it.
func isDataFault(err error) bool {
	var be *badMetaError
	return errors.Is(err, ErrNotExist) || errors.As(err, &be)
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

// verifyCheckpoint checks flow f's checkpoint object of group against
// Redis: the global one of layout v2 (v2/global_checkpoint/<group>.ts) if
// it exists, else the flow's v1 object. If neither exists, the report
// names the checkpoint objects there are instead (flowCkpts: those of the
// flow's directory, of other groups or of another flow id of the same
// name; and v2 ones of other groups): a --group other than the consumer's
// is the likely cause.
func verifyCheckpoint(ctx context.Context, b Bucket, f Flow, group string, flowCkpts []string, r *VerifyReport) error {
	name := CheckpointPathV2(f.Prefix, group)
	if _, err := b.Size(ctx, name); errors.Is(err, ErrNotExist) {
		name = CheckpointPath(f.Prefix, f.Catalog, f.Name, group, f.ID)
		v2dir := path.Dir(CheckpointPathV2(f.Prefix, group)) + "/"
		if err := b.Iter(ctx, v2dir, func(n string) error { flowCkpts = append(flowCkpts, n); return nil }); err != nil {
			return fmt.Errorf("list %s: %w", v2dir, err)
		}
	} else if err != nil {
		return err
	}
	r.CheckpointObject = name
	others := flowCkpts
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
