package pipeline_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
)

// Redis loses an acknowledged commit (its offset and meta listing, as an
// unsynced AOF tail or a failover would) while the consumer runs. The
// consumer's next commit finds the offset not where its cycle started: it is
// refused as fenced, the session rejoins and reads the partition again from
// the offset Redis holds. Every produced event ends up in a listed meta:
// nothing is skipped.
func TestCommitAfterLostRedisWritesSkipsNothing(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("lost", 1)
	rdb := r.redis.Client(t)
	k := r.store.Keys()

	want := map[string]bool{}
	produced := int64(0)
	round := func(n int) {
		t.Helper()
		b := putBatch(1, 1, produced*10, n, produced*10)
		for _, e := range b.Events {
			want[string(e.Key)+"\x00"+string(e.Value)] = true
		}
		r.produceBatch(b)
		produced++
		r.waitHandled(produced)
		r.flush()
	}
	listed := func() []string {
		t.Helper()
		refs, err := r.store.Metas(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range refs {
			out = append(out, m.Path)
		}
		return out
	}

	round(5)
	round(5)
	before := listed()
	round(5)
	// The third commit is lost: its meta listing and offset go.
	var lostMeta []string
	for _, m := range listed() {
		if !slices.Contains(before, m) {
			lostMeta = append(lostMeta, m)
		}
	}
	if len(lostMeta) != 1 {
		t.Fatalf("third cycle listed %v, want one meta", lostMeta)
	}
	if err := rdb.ZRem(ctx, k.Metas(id), lostMeta[0]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, k.Offset(testenv.ApplyTopic, 0), "2", 0).Err(); err != nil {
		t.Fatal(err)
	}

	b := putBatch(1, 1, produced*10, 5, produced*10)
	for _, e := range b.Events {
		want[string(e.Key)+"\x00"+string(e.Value)] = true
	}
	r.produceBatch(b)
	produced++
	r.eventually(30*time.Second, func() bool {
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if r.cons.Flush(fctx) != nil {
			return false
		}
		off, ok, err := r.store.Offset(ctx, testenv.ApplyTopic, 0)
		return err == nil && ok && off == produced
	}, "offset committed to the end again ("+strconv.FormatInt(produced, 10)+")")

	_, got := r.entries(id)
	for e := range want {
		if got[e] == 0 {
			t.Fatalf("an event of %d is in no listed meta: skipped", len(want))
		}
	}
	for e, n := range got {
		if !want[e] || n != 1 {
			t.Fatalf("entry listed %d times (produced: %v), want once", n, want[e])
		}
	}
}
