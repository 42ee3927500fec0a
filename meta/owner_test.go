package meta_test

import (
	"context"
	"errors"
	"sync"
	"testing"

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
