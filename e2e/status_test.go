package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// statusNext returns the next offset of each partition in the consumer's
// /status at base ("http://host:port"), as reported: -1 for a partition
// with nothing consumed yet.
func statusNext(cl *http.Client, base string) (map[int32]int64, error) {
	resp, err := cl.Get(base + "/status")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/status: %s", resp.Status)
	}
	var st struct {
		Partitions []struct {
			Partition int32 `json:"partition"`
			Next      int64 `json:"next_offset"`
		} `json:"partitions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("/status: %w", err)
	}
	next := map[int32]int64{}
	for _, p := range st.Partitions {
		next[p.Partition] = p.Next
	}
	return next, nil
}

// opsStatusNextWith is statusNext with a partition that has nothing
// consumed yet at 0.
func opsStatusNextWith(cl *http.Client, base string) (map[int32]int64, error) {
	next, err := statusNext(cl, base)
	for p, n := range next {
		next[p] = max(n, 0)
	}
	return next, err
}
