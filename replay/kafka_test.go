package replay_test

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// endOffset is the end offset of partition p of topic, an error if there
// is no such partition.
func endOffset(ctx context.Context, cl *kgo.Client, topic string, p int32) (int64, error) {
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	o, ok := ends.Lookup(topic, p)
	if !ok || o.Err != nil {
		return 0, fmt.Errorf("no partition %d", p)
	}
	return o.Offset, nil
}
