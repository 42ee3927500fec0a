package pipeline_test

import (
	"context"
	"io"
	"testing"

	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// v2Metas decodes every layout v2 meta in the rig's bucket, by name.
func v2Metas(t *testing.T, r *rig) map[string]sink.Meta {
	t.Helper()
	ctx := context.Background()
	out := map[string]sink.Meta{}
	err := r.bucket.Iter(ctx, sink.V2MetaDir("backup"), func(name string) error {
		rc, err := r.bucket.Get(ctx, name)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		m, err := sink.DecodeMeta(b)
		if err != nil {
			return err
		}
		out[name] = m
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The cycle that carries only the coverage reports opening a new flow's
// windows writes a meta without a data object; its commit lists it under
// every flow the meta names, as it lists a meta with chunks, so that gc
// keeps it and recovery reads its reports (docs/FORMAT.md, "Meta objects,
// version 2"). No meta a committed cycle wrote is listed by no flow.
func TestV2CoverageOnlyMetaListed(t *testing.T) {
	r := newRig(t, 1, newCountingBucket(), func(c *pipeline.Config) { c.Layout = pipeline.LayoutV2 })
	r.start()
	r.heartbeats(1, 0)
	r.waitHandled(1)
	r.flush()
	id := r.createFlow("cov", 1)
	r.settle()

	refs, err := r.store.Metas(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, ref := range refs {
		listed[ref.Path] = true
	}
	covOnly := 0
	for name, m := range v2Metas(t, r) {
		if len(m.Files) == 0 && len(m.Coverage) > 0 {
			covOnly++
			if m.DataPath != "" {
				t.Errorf("meta %s of coverage reports only names data object %q", name, m.DataPath)
			}
		}
		if !listed[name] {
			t.Errorf("meta %s (%d files, %d coverage reports) is listed by no flow", name, len(m.Files), len(m.Coverage))
		}
	}
	if covOnly == 0 {
		t.Fatal("no cycle carried coverage reports alone: the test shows nothing")
	}
}
