package meta

import (
	"context"
	"fmt"
	"strconv"
)

// PartitionRegions returns regions:<topic>:<partition>, the live regions and
// their resolved ts as of the partition's last commit.
func (s *Store) PartitionRegions(ctx context.Context, topic string, partition int32) (map[uint64]uint64, error) {
	m, err := s.rdb.HGetAll(ctx, s.keys.Regions(topic, partition)).Result()
	if err != nil {
		return nil, fmt.Errorf("read regions of %s/%d: %w", topic, partition, err)
	}
	out := make(map[uint64]uint64, len(m))
	for k, v := range m {
		r, err1 := strconv.ParseUint(k, 10, 64)
		ts, err2 := strconv.ParseUint(v, 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("regions of %s/%d: bad entry %q=%q", topic, partition, k, v)
		}
		out[r] = ts
	}
	return out, nil
}
