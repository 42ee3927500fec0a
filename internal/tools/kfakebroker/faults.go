package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// faultSpec is the parsed --faults flag: the probability with which each
// kind of request fails with a retriable error, and how often partition
// leaders and group coordinators move between the broker's nodes.
//
//	fetch=0.2,commit=0.3,produce=0.1,coordinator-move-every=5s,partition-move-every=5s
type faultSpec struct {
	fetch, commit, produce float64
	coordinatorMove        time.Duration
	partitionMove          time.Duration
}

func parseFaults(s string) (faultSpec, error) {
	var f faultSpec
	if s == "" {
		return f, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return f, fmt.Errorf("--faults %q: %q is not key=value", s, kv)
		}
		switch k {
		case "fetch", "commit", "produce":
			p, err := strconv.ParseFloat(v, 64)
			if err != nil || p < 0 || p > 1 {
				return f, fmt.Errorf("--faults %s=%s: want a probability in [0, 1]", k, v)
			}
			switch k {
			case "fetch":
				f.fetch = p
			case "commit":
				f.commit = p
			default:
				f.produce = p
			}
		case "coordinator-move-every", "partition-move-every":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return f, fmt.Errorf("--faults %s=%s: want a positive duration", k, v)
			}
			if k == "coordinator-move-every" {
				f.coordinatorMove = d
			} else {
				f.partitionMove = d
			}
		default:
			return f, fmt.Errorf("--faults: unknown key %q (fetch, commit, produce, coordinator-move-every, partition-move-every)", k)
		}
	}
	return f, nil
}

// faultStats counts what the faults did; printed on shutdown.
type faultStats struct {
	fetch, commit, produce, coordinatorMoves, partitionMoves atomic.Int64
}

func (s *faultStats) String() string {
	return fmt.Sprintf("faults injected: fetch=%d commit=%d produce=%d coordinator-moves=%d partition-moves=%d",
		s.fetch.Load(), s.commit.Load(), s.produce.Load(), s.coordinatorMoves.Load(), s.partitionMoves.Load())
}

// install adds the request faults to c and starts the movers; stop ends the
// movers.
func (f faultSpec) install(c *kfake.Cluster, topics []string, partitions map[string]int32, nodes int) (stats *faultStats, stop func()) {
	stats = &faultStats{}
	chance := func(p float64, n *atomic.Int64) func(kmsg.Request) bool {
		return func(kmsg.Request) bool {
			if rand.Float64() < p {
				n.Add(1)
				return true
			}
			return false
		}
	}
	if f.fetch > 0 {
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Err: kerr.NotLeaderForPartition, Count: -1, When: chance(f.fetch, &stats.fetch)})
	}
	if f.produce > 0 {
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: -1, When: chance(f.produce, &stats.produce)})
	}
	if f.commit > 0 {
		// Half of them each with one of the two coordinator errors
		// clients must retry.
		for _, err := range []*kerr.Error{kerr.NotCoordinator, kerr.CoordinatorLoadInProgress} {
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: err, Count: -1, When: chance(f.commit/2, &stats.commit)})
		}
	}
	done := make(chan struct{})
	tick := func(every time.Duration, fn func()) {
		if every <= 0 {
			return
		}
		go func() {
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					fn()
				}
			}
		}()
	}
	tick(f.coordinatorMove, func() {
		c.RehashCoordinators()
		stats.coordinatorMoves.Add(1)
	})
	tick(f.partitionMove, func() {
		for _, t := range topics {
			for p := range partitions[t] {
				node := int32(rand.IntN(nodes))
				if err := c.MoveTopicPartition(t, p, node); err != nil {
					fmt.Fprintf(os.Stderr, "kfakebroker: move %s/%d to node %d: %v\n", t, p, node, err)
					continue
				}
				stats.partitionMoves.Add(1)
			}
		}
	})
	return stats, func() { close(done) }
}
