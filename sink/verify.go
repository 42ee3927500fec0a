package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
)

// VerifyReport is the result of Verify. Faults lists every problem found, one
// sentence each; a backup is sound when there are none.
type VerifyReport struct {
	Metas            int      `json:"metas"`
	DataObjects      int      `json:"data_objects"`
	Chunks           int      `json:"chunks"`
	ChunkBytes       int64    `json:"chunk_bytes"` // uncompressed bytes checked
	CheckpointObject string   `json:"checkpoint_object,omitempty"`
	CheckpointTS     uint64   `json:"checkpoint_ts"` // read from the object
	RedisCheckpoint  uint64   `json:"redis_checkpoint_ts"`
	Faults           []string `json:"faults"`
}

// OK reports whether no fault was found.
func (r *VerifyReport) OK() bool { return len(r.Faults) == 0 }

func (r *VerifyReport) fault(format string, args ...any) {
	r.Faults = append(r.Faults, fmt.Sprintf(format, args...))
}

// Verify checks a flow's backup: every meta in metaPaths and every data
// object they reference exists, every chunk lies inside its object and
// matches its sha256, no two metas cover the same offsets of a Kafka
// partition (which would mean an event backed up twice), and the checkpoint
// object, if named, holds redisCheckpoint. Problems are Faults in the
// report; the error is for failures to check at all (such as a cancelled
// ctx or an unreachable store).
func Verify(ctx context.Context, b Bucket, metaPaths []string, checkpointObject string, redisCheckpoint uint64) (VerifyReport, error) {
	r := VerifyReport{CheckpointObject: checkpointObject, RedisCheckpoint: redisCheckpoint, Faults: []string{}}
	type covered struct {
		OffsetRange
		meta string
	}
	ranges := map[string][]covered{}
	var jobs []chunkJob
	for _, mp := range metaPaths {
		m, err := readMeta(ctx, b, mp)
		if err != nil {
			if !isDataFault(err) {
				return r, err
			}
			r.fault("meta %s: %v", mp, err)
			continue
		}
		r.Metas++
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

	if err := verifyChunks(ctx, b, jobs, &r); err != nil {
		return r, err
	}
	if checkpointObject != "" {
		if err := verifyCheckpoint(ctx, b, checkpointObject, &r); err != nil {
			return r, err
		}
	}
	return r, nil
}

// isDataFault tells a problem with the backup's content (a missing or
// undecodable meta) from a failure to read it.
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

func checkChunk(ctx context.Context, b Bucket, j chunkJob) (int64, error) {
	rc, err := OpenChunk(ctx, b, j.path, j.index, j.f)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}

func verifyCheckpoint(ctx context.Context, b Bucket, name string, r *VerifyReport) error {
	rc, err := b.Get(ctx, name)
	if errors.Is(err, ErrNotExist) {
		if r.RedisCheckpoint != 0 {
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
