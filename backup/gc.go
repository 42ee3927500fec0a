package backup

import (
	"context"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// RefReader reads everything the metadata references in the bucket:
// *meta.Store's References.
type RefReader interface {
	References(ctx context.Context) (meta.References, error)
}

// GCRefs is gc's view of what is referenced (sink.GCOptions.Refs): every
// listed meta and snapshot of every flow id that has any, live or dropped,
// and the flow ids the metadata has or had. gc deletes only objects outside
// it, so it never removes what a restore may read.
func GCRefs(st RefReader) func(ctx context.Context) (sink.GCRefs, error) {
	return func(ctx context.Context) (sink.GCRefs, error) {
		l, err := st.References(ctx)
		return sink.GCRefs{Metas: l.Metas, Snapshots: l.Snapshots, KnownIDs: l.KnownIDs}, err
	}
}
