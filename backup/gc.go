package backup

import (
	"context"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// RefLister reads everything the metadata references in the bucket:
// *meta.Store's Listed.
type RefLister interface {
	Listed(ctx context.Context) (meta.Listed, error)
}

// GCRefs is gc's view of what is referenced (sink.GCOptions.Refs): every
// listed meta and snapshot of every flow id that has any, live or dropped,
// and the flow ids the metadata has or had. gc deletes only objects outside
// it, so it never removes what a restore may read.
func GCRefs(st RefLister) func(ctx context.Context) (sink.GCRefs, error) {
	return func(ctx context.Context) (sink.GCRefs, error) {
		l, err := st.Listed(ctx)
		return sink.GCRefs{Metas: l.Metas, Snapshots: l.Snapshots, KnownIDs: l.KnownIDs}, err
	}
}
