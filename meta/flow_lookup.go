package meta

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// FlowPartition is one partition of a flow, as listed in a flownode's set.
type FlowPartition struct {
	FlowID      FlowID
	PartitionID uint32
}

// TableRoute is one entry of a table's index: a partition of a flow that
// reads the table, the flownode it is placed on and its route.
type TableRoute struct {
	FlownodeID  uint64
	FlowID      FlowID
	PartitionID uint32
	Route       Route
}

// FlowIDByName returns the id of the flow named name in catalog, and false
// if there is none.
func (s *Store) FlowIDByName(ctx context.Context, catalog, name string) (FlowID, bool, error) {
	return getFlowID(ctx, s.rdb, s.keys.FlowName(catalog, name))
}

// FlowInfo returns the stored info of flow id, and false if there is none.
func (s *Store) FlowInfo(ctx context.Context, id FlowID) (FlowInfo, bool, error) {
	key := s.keys.FlowInfo(id)
	v, ok, err := getString(ctx, s.rdb, key)
	if err != nil || !ok {
		return FlowInfo{}, ok, err
	}
	info, err := decodeInfo(key, v)
	return info, err == nil, err
}

// FlowRoutes returns the routes of flow id by partition id; empty if the
// flow does not exist.
func (s *Store) FlowRoutes(ctx context.Context, id FlowID) (map[uint32]Route, error) {
	return readRoutes(ctx, s.rdb, s.keys.FlowRoutes(id))
}

// FlownodeFlows returns the flow partitions placed on flownode node, sorted
// by flow id then partition id.
func (s *Store) FlownodeFlows(ctx context.Context, node uint64) ([]FlowPartition, error) {
	key := s.keys.Flownode(node)
	members, err := s.rdb.SMembers(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("smembers %s: %w", key, err)
	}
	out := make([]FlowPartition, 0, len(members))
	for _, m := range members {
		f, err := parseIDs(m, 2)
		if err != nil {
			return nil, fmt.Errorf("parse %s member %q: %w", key, m, err)
		}
		out = append(out, FlowPartition{FlowID: FlowID(f[0]), PartitionID: uint32(f[1])})
	}
	slices.SortFunc(out, func(a, b FlowPartition) int {
		if a.FlowID != b.FlowID {
			return cmpU(a.FlowID, b.FlowID)
		}
		return cmpU(a.PartitionID, b.PartitionID)
	})
	return out, nil
}

// TableFlows returns the flow partitions reading table, sorted by flow id,
// partition id and flownode id.
func (s *Store) TableFlows(ctx context.Context, table uint32) ([]TableRoute, error) {
	key := s.keys.Table(table)
	raw, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("hgetall %s: %w", key, err)
	}
	out := make([]TableRoute, 0, len(raw))
	for field, v := range raw {
		f, err := parseIDs(field, 3)
		if err != nil || f[1] > uint64(^uint32(0)) || f[2] > uint64(^uint32(0)) {
			return nil, fmt.Errorf("parse %s field %q: bad ids", key, field)
		}
		tr := TableRoute{FlownodeID: f[0], FlowID: FlowID(f[1]), PartitionID: uint32(f[2])}
		if err := json.Unmarshal([]byte(v), &tr.Route); err != nil {
			return nil, fmt.Errorf("decode %s field %q: %w", key, field, err)
		}
		out = append(out, tr)
	}
	slices.SortFunc(out, func(a, b TableRoute) int {
		switch {
		case a.FlowID != b.FlowID:
			return cmpU(a.FlowID, b.FlowID)
		case a.PartitionID != b.PartitionID:
			return cmpU(a.PartitionID, b.PartitionID)
		}
		return cmpU(a.FlownodeID, b.FlownodeID)
	})
	return out, nil
}

// AllFlows returns the ids of every flow, sorted.
func (s *Store) AllFlows(ctx context.Context) ([]FlowID, error) {
	key := s.keys.Flows()
	members, err := s.rdb.SMembers(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("smembers %s: %w", key, err)
	}
	out := make([]FlowID, 0, len(members))
	for _, m := range members {
		id, err := strconv.ParseUint(m, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("parse %s member %q: %w", key, m, err)
		}
		out = append(out, FlowID(id))
	}
	slices.Sort(out)
	return out, nil
}

// parseIDs splits "a/b/..." into n decimal integers; the first may be a
// uint64, every other must fit a uint32.
func parseIDs(s string, n int) ([]uint64, error) {
	parts := strings.Split(s, "/")
	if len(parts) != n {
		return nil, fmt.Errorf("want %d ids, got %d", n, len(parts))
	}
	out := make([]uint64, n)
	for i, p := range parts {
		bits := 32
		if i == 0 && n == 3 {
			bits = 64
		}
		v, err := strconv.ParseUint(p, 10, bits)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func cmpU[T ~uint32 | ~uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
