package main

import (
	"context"
	"fmt"

	"github.com/flowlog/flowlog/catalog"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// writeCatalogs uploads the catalog of every flow whose catalog content
// changed since its last upload: what snapshot and truncate just changed in
// Redis, and whatever a consumer had not uploaded yet. Truncate and gc call
// it before they delete any object, snapshot after it lists its snapshot,
// so that the bucket alone (restore --from-bucket) always says why an
// object is gone and which snapshots stand in for it (docs/FORMAT.md,
// "Layout v2").
func writeCatalogs(ctx context.Context, conn *connConfig, st *meta.Store, b sink.Bucket) error {
	w := catalog.Writer{Store: st, Bucket: b, Prefix: conn.GCS.Prefix, Group: conn.Group}
	if _, err := w.WriteDirty(ctx); err != nil {
		return fmt.Errorf("write the catalogs of the changed flows: %w", err)
	}
	return nil
}
