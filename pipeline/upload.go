package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// upload is one data object and its meta: a flow's share of a cycle in
// layout v1, the whole cycle in layout v2. The data object is its temp
// files back to back, each already its chunk (stored or zstd frames, see
// tempFile): they are sealed and never change, so every retry uploads the
// same bytes.
//
// Its names carry the cycle id, with "-r<renames>" once renamed
// (retryName): an upload takes new names when another object already sits
// under one of them (an attacker's, or anyone's: names are never shared),
// and when its objects have waited too long for their commit
// (commitage.go).
type upload struct {
	flow  *meta.Flow // layout v1: the flow; nil in layout v2
	files []*tempFile

	renames            int
	built              bool // meta, size and CRC32C known
	size               int64
	crc                uint32
	meta               sink.Meta
	dataPath, metaPath string
	dataDone, metaDone bool
}

// retryName is the cycle id of a cycle's objects after n renames: the id
// itself, then <id>-r<n>.
func retryName(id string, n int) string {
	if n == 0 {
		return id
	}
	return fmt.Sprintf("%s-r%d", id, n)
}

// maxRenames bounds the renames of one attempt when every new name is
// taken too; the next attempt (after the retry backoff) renames again.
const maxRenames = 4

// refs are the metas:<flow_id> entries the commit lists for u: its meta,
// under its flow (layout v1) or under every flow its meta names (layout
// v2: the flows with a chunk in it and those with a coverage report). A
// meta of coverage reports only is thus listed too: a meta no flow lists
// is a crashed cycle's to gc and recovery (docs/FORMAT.md, "Meta objects,
// version 2").
func (u *upload) refs() []meta.MetaRef {
	if u.flow != nil {
		return []meta.MetaRef{{FlowID: u.flow.ID, Path: u.metaPath, MinResolvedTS: u.meta.MinResolvedTS}}
	}
	out := make([]meta.MetaRef, len(u.meta.Flows))
	for i, mf := range u.meta.Flows {
		out[i] = meta.MetaRef{FlowID: mf.FlowID, Path: u.metaPath, MinResolvedTS: u.meta.MinResolvedTS}
	}
	return out
}

// failedFlows are the flows a failed upload of u counts against: its flow
// (layout v1), or every flow the cycle's meta serves (layout v2: chunks
// and coverage reports, cycle.served).
func (u *upload) failedFlows(cyc *cycle) []*meta.Flow {
	if u.flow != nil {
		return []*meta.Flow{u.flow}
	}
	return cyc.served()
}

// uploadAll uploads what is not uploaded yet of the cycle's uploads,
// --upload-parallelism at a time. A failed upload counts a failed cycle for
// its flows (fatal.failed).
func (f *flusher) uploadAll(ctx context.Context, cyc *cycle) error {
	c := f.c
	sem := make(chan struct{}, c.cfg.UploadParallel)
	var wg sync.WaitGroup
	errs := make([]error, len(cyc.uploads))
	for i, u := range cyc.uploads {
		if u.dataDone && u.metaDone {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f.uploadRenaming(ctx, cyc, u)
		})
	}
	wg.Wait()
	var failed []error
	for i, err := range errs {
		if err == nil {
			continue
		}
		failed = append(failed, err)
		c.fatal.failed(ctx, cyc.uploads[i].failedFlows(cyc), err)
	}
	return errors.Join(failed...)
}

// uploadRenaming uploads u, taking new names at once when one of them holds
// another object (the earlier upload of the names, if any, stays garbage for
// gc): waiting would never free the name.
func (f *flusher) uploadRenaming(ctx context.Context, cyc *cycle, u *upload) error {
	for n := 0; ; n++ {
		err := f.uploadOne(ctx, cyc, u)
		if err == nil || !errors.Is(err, errForeignObject) || n == maxRenames {
			return err
		}
		old := u.metaPath
		f.rename(cyc, u)
		f.c.log.Warn("an object of the flush cycle's names holds other content; uploading under new names", "cycle", cyc.id,
			"new_id", retryName(cyc.id, u.renames), "meta", old, "err", err)
	}
}

// rename gives u the next retry names; everything is uploaded again.
func (f *flusher) rename(cyc *cycle, u *upload) {
	u.renames++
	if u.built {
		f.name(cyc, u)
	}
	u.dataDone, u.metaDone = len(u.files) == 0, false // a meta of reports only has no data object
}

func (f *flusher) uploadOne(ctx context.Context, cyc *cycle, u *upload) error {
	c := f.c
	if !u.built {
		if err := f.build(cyc, u); err != nil {
			return err
		}
	}
	if !u.dataDone {
		body := newChunkReader(u.files)
		err := c.d.Bucket.Upload(ctx, sink.Object{Name: u.dataPath, Body: body, Size: u.size, CRC32C: u.crc})
		body.Close()
		if err := uploaded(ctx, c.d.Bucket, u.dataPath, u.size, u.crc, err); err != nil {
			return fmt.Errorf("%s: %w", u.what(), err)
		}
		u.dataDone = true
		cyc.uploaded()
		c.m.objectBytes.Observe(float64(u.size))
	}
	if !u.metaDone {
		b, err := encodeMeta(u)
		if err != nil {
			return fmt.Errorf("%s: encode meta: %w", u.what(), err)
		}
		err = c.d.Bucket.Upload(ctx, sink.Object{Name: u.metaPath, Body: bytes.NewReader(b), Size: int64(len(b)), CRC32C: sink.CRC32C(b)})
		if err := uploaded(ctx, c.d.Bucket, u.metaPath, int64(len(b)), sink.CRC32C(b), err); err != nil {
			return fmt.Errorf("%s: %w", u.what(), err)
		}
		u.metaDone = true
		cyc.uploaded()
	}
	return nil
}

// what names u in errors: its flow, or the cycle.
func (u *upload) what() string {
	if u.flow != nil {
		return "flow " + flowLabel(u.flow.Info.CatalogName, u.flow.Info.FlowName)
	}
	return "cycle " + u.meta.CycleID
}

// errForeignObject is an upload's ErrExists for an object that is not the
// one this cycle wrote.
var errForeignObject = errors.New("object exists with other content")

// uploaded interprets the result err of uploading name (size bytes, CRC32C
// crc). ErrExists counts as success only when the stored object is this
// one: an earlier attempt of the cycle wrote it and only its answer was
// lost. Anything else stored under the name is errForeignObject, never
// taken as ours.
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
