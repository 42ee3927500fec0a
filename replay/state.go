package replay

import (
	"context"
	"errors"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/sink"
)

// runState is a --mode state replay.
func runState(ctx context.Context, b sink.Bucket, f sink.Flow, plan backup.ReadPlan, req *Request, w *writer) error {
	return errors.New("state mode is not built yet")
}
