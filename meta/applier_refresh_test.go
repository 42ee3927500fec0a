package meta_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// failSMembers fails the next SMEMBERS while armed: the registry refresh's
// first read, after the DDL's MULTI went through.
type failSMembers struct{ armed atomic.Bool }

func (h *failSMembers) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failSMembers) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failSMembers) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "smembers" && h.armed.CompareAndSwap(true, false) {
			err := errors.New("injected: connection reset between the DDL commit and the registry refresh")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// A registry refresh that fails after a DDL was applied is retried by the
// next catch-up before that one can succeed: the router never keeps a stale
// registry, which would route records past a DDL the registry has not
// loaded (docs/FORMAT.md, "DDL barrier").
func TestCatchUpRetriesAFailedRegistryRefresh(t *testing.T) {
	e := newDDLEnv(t)
	hook := &failSMembers{}
	e.rdb.AddHook(hook)
	a := e.applier(t, nil)
	ctx := context.Background()
	if _, err := a.CatchUp(ctx); err != nil { // empty topic
		t.Fatalf("first catch-up: %v", err)
	}

	e.publish(t, ddlJSON("create", "f1", 1))
	hook.armed.Store(true)
	if _, err := a.CatchUp(ctx); err == nil {
		t.Fatal("catch-up whose registry refresh failed returned nil")
	}
	if hook.armed.Load() {
		t.Fatal("the injected failure was not hit")
	}
	got, err := a.CatchUp(ctx)
	if err != nil {
		t.Fatalf("catch-up after the failure: %v", err)
	}
	if len(a.r.ForTable(1)) != 1 {
		t.Fatalf("registry after the retried catch-up routes table 1 to %d flows, want 1 (stale registry)", len(a.r.ForTable(1)))
	}
	if len(got) != 1 || !got[0].Changed {
		t.Fatalf("retried catch-up returned %+v, want the create applied by the failed one", got)
	}
}
