package meta_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

func TestClaimOwner(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client(t)
	s := meta.NewStore(rdb, "", nil)
	other := meta.NewStore(rdb, "other", nil)

	for _, step := range []struct {
		name  string
		store *meta.Store
		group string
		owner string // non-empty: want an *OwnerError naming it
	}{
		{"first group claims", s, "g1", ""},
		{"same group again", s, "g1", ""},
		{"second group refused", s, "g2", "g1"},
		{"second group under another prefix", other, "g2", ""},
		{"first group refused there", other, "g1", "g2"},
	} {
		t.Run(step.name, func(t *testing.T) {
			err := step.store.ClaimOwner(ctx, step.group)
			var oe *meta.OwnerError
			switch {
			case step.owner == "" && err != nil:
				t.Fatalf("ClaimOwner(%s) = %v", step.group, err)
			case step.owner != "" && !errors.As(err, &oe):
				t.Fatalf("ClaimOwner(%s) = %v, want *OwnerError", step.group, err)
			case step.owner != "" && (oe.Owner != step.owner || oe.Group != step.group):
				t.Fatalf("ClaimOwner(%s) = %+v, want owner %s", step.group, oe, step.owner)
			}
		})
	}
	// The key is <prefix>:{flowlog}:owner, where operators look for it
	// (docs/FORMAT.md, "Redis keys"), under each prefix apart.
	for key, want := range map[string]string{"flowlog:{flowlog}:owner": "g1", "other:{flowlog}:owner": "g2"} {
		if got, err := rdb.Get(ctx, key).Result(); err != nil || got != want {
			t.Errorf("GET %s = %q, %v; want %q", key, got, err, want)
		}
	}
}

// TestClaimOwnerRace: of groups claiming an empty prefix at once, exactly
// one wins and every other one is told its name.
func TestClaimOwnerRace(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client(t)
	s := meta.NewStore(rdb, "race", nil)
	groups := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() { errs[i] = s.ClaimOwner(ctx, g) })
	}
	wg.Wait()
	owner, err := rdb.Get(ctx, s.Keys().Owner()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		var oe *meta.OwnerError
		switch {
		case groups[i] == owner && err != nil:
			t.Errorf("owner %s: ClaimOwner = %v", owner, err)
		case groups[i] != owner && (!errors.As(err, &oe) || oe.Owner != owner):
			t.Errorf("group %s: ClaimOwner = %v, want *OwnerError naming %s", groups[i], err, owner)
		}
	}
}

// TestOwnerGuard: once a store claimed its prefix, the writes of a running
// consumer refuse to rebuild state on a Redis that lost it. After FLUSHALL,
// or after the prefix's keys were deleted, commit, lease, DDL and DLQ claim
// all fail with an *OwnerLostError (which also fences like a lost lease),
// and nothing is written under the prefix. A store of another group that
// took the prefix over is named in the error. A store that never claimed
// (operator tools, tests) is not guarded.
func TestOwnerGuard(t *testing.T) {
	ctx := context.Background()
	const topic = "flowlog.apply"
	writes := map[string]func(s *meta.Store, l meta.Lease) error{
		"commit": func(s *meta.Store, l meta.Lease) error {
			return s.Commit(ctx, meta.Commit{Leases: []meta.Lease{l},
				Partitions: []meta.PartitionCommit{{Topic: topic, Partition: 0, NextOffset: 10, CheckFrom: true, From: -1}},
				Metas:      []meta.MetaRef{{FlowID: 1, Path: "p/v2/meta/x.meta", MinResolvedTS: 5}}})
		},
		"acquire lease": func(s *meta.Store, _ meta.Lease) error {
			_, err := s.AcquireLease(ctx, topic, 1, "m")
			return err
		},
		"apply ddl": func(s *meta.Store, _ meta.Lease) error {
			_, err := s.ApplyDDL(ctx, newDDL(meta.OpCreate, "f", 1), at(1))
			return err
		},
		"advance ddl offset": func(s *meta.Store, _ meta.Lease) error {
			return s.AdvanceDDLOffset(ctx, at(3))
		},
		"claim ddl reject": func(s *meta.Store, _ meta.Lease) error {
			_, err := s.ClaimDDLReject(ctx, meta.RejectedDDL{Topic: ddlTopic, Partition: 0, Offset: 4, Owner: "x", Reason: "r"})
			return err
		},
		// The checkpoint advance runs after a commit that may have been the
		// last before the flush: its turn and its global checkpoint must
		// not recreate keys either.
		"take advance turn": func(s *meta.Store, _ meta.Lease) error {
			_, err := s.TakeAdvanceTurn(ctx, "m", time.Minute)
			return err
		},
		"advance checkpoints": func(s *meta.Store, _ meta.Lease) error {
			_, _, err := s.AdvanceCheckpoints(ctx, nil, 100, 200)
			return err
		},
	}
	for _, lose := range []struct {
		name  string
		do    func(rdb *redis.Client, s *meta.Store) error
		found string
	}{
		{"flushall", func(rdb *redis.Client, _ *meta.Store) error { return rdb.FlushAll(ctx).Err() }, ""},
		{"prefix deleted", func(rdb *redis.Client, s *meta.Store) error {
			ks, err := rdb.Keys(ctx, s.Keys().Base()+"*").Result()
			if err != nil {
				return err
			}
			return rdb.Del(ctx, ks...).Err()
		}, ""},
		{"another group", func(rdb *redis.Client, s *meta.Store) error {
			if err := rdb.Del(ctx, s.Keys().Owner()).Err(); err != nil {
				return err
			}
			return meta.NewStore(rdb, "", nil).ClaimOwner(ctx, "g2")
		}, "g2"},
	} {
		for name, write := range writes {
			t.Run(lose.name+"/"+name, func(t *testing.T) {
				rdb := testenv.StartRedis(t).Client(t)
				s := meta.NewStore(rdb, "", nil)
				if err := s.ClaimOwner(ctx, "g1"); err != nil {
					t.Fatal(err)
				}
				l, err := s.AcquireLease(ctx, topic, 0, "m")
				if err != nil {
					t.Fatalf("lease while owned: %v", err)
				}
				if err := lose.do(rdb, s); err != nil {
					t.Fatal(err)
				}
				before := keysUnder(t, rdb, s.Keys().Base())
				err = write(s, l)
				var ol *meta.OwnerLostError
				if !errors.As(err, &ol) || ol.Group != "g1" || ol.Found != lose.found || ol.Key != s.Keys().Owner() {
					t.Fatalf("%s = %v, want an *OwnerLostError of g1 finding %q", name, err, lose.found)
				}
				if !errors.Is(err, meta.ErrOwnerLost) || !errors.Is(err, meta.ErrLeaseLost) {
					t.Fatalf("%v: errors.Is ErrOwnerLost %v, ErrLeaseLost %v; want both", err,
						errors.Is(err, meta.ErrOwnerLost), errors.Is(err, meta.ErrLeaseLost))
				}
				if !strings.Contains(err.Error(), "consumer recover") {
					t.Errorf("error %q does not name `consumer recover`", err)
				}
				if after := keysUnder(t, rdb, s.Keys().Base()); !slices.Equal(after, before) {
					t.Fatalf("keys under the prefix went from %v to %v", before, after)
				}
			})
		}
	}
	t.Run("unclaimed store is not guarded", func(t *testing.T) {
		rdb := testenv.StartRedis(t).Client(t)
		s := meta.NewStore(rdb, "", nil)
		l, err := s.AcquireLease(ctx, topic, 0, "m")
		if err != nil {
			t.Fatal(err)
		}
		for name, write := range writes {
			if err := write(s, l); err != nil {
				t.Errorf("%s on a store that never claimed: %v", name, err)
			}
		}
	})
}
