package sink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

func TestVerify(t *testing.T) {
	ctx := context.Background()
	evs := []kv{wput(1, 1, 10, 9, "a"), dput(1, 2, 5, []byte("default value")), wput(1, 2, 6, 5, ""), wtype(2, 3, 7, 6, event.WriteDelete)}
	offsets := func(from, to int64) func(*sink.Meta) {
		return func(m *sink.Meta) {
			m.Offsets = []sink.OffsetRange{{Topic: "apply", Partition: 0, From: from, To: to}, {Topic: "apply", Partition: 1, From: 0, To: 5}}
		}
	}
	const ckpt = "default/f/v1/global_checkpoint/flowlog-1.ts"
	for _, tc := range []struct {
		name   string
		redis  uint64
		mod    func(t *testing.T, b *sink.MemBucket, metas *[]string)
		faults []string // substrings, one per expected fault
	}{
		{"clean", 42, nil, nil},
		{"flipped byte", 42, func(t *testing.T, b *sink.MemBucket, metas *[]string) {
			m := metaOf(t, b, (*metas)[1])
			if !b.Corrupt(m.DataPath, m.Files[1].Offset+2) {
				t.Fatal("corrupt")
			}
		}, []string{"chunk 1 (offset"}},
		{"missing data object", 42, func(t *testing.T, b *sink.MemBucket, metas *[]string) {
			b.Delete(ctx, metaOf(t, b, (*metas)[0]).DataPath)
		}, []string{"is missing"}},
		{"missing meta", 42, func(t *testing.T, b *sink.MemBucket, metas *[]string) {
			*metas = append(*metas, "default/f/v1/backupmeta/nope.meta")
		}, []string{"nope.meta"}},
		{"overlapping offsets", 42, func(t *testing.T, b *sink.MemBucket, metas *[]string) {
			*metas = append(*metas, writeBackupWith(t, b, "c3", "none", evs[:1], offsets(15, 25)))
		}, []string{"offsets of apply/0 overlap", "offsets of apply/1 overlap"}},
		{"overlap inside a wide range", 42, func(t *testing.T, b *sink.MemBucket, metas *[]string) {
			*metas = append(*metas, writeBackupWith(t, b, "c5", "none", evs[:1], func(m *sink.Meta) {
				m.Offsets = []sink.OffsetRange{{Topic: "apply", Partition: 7, From: 0, To: 100}}
			}), writeBackupWith(t, b, "c6", "none", evs[:1], func(m *sink.Meta) {
				m.Offsets = []sink.OffsetRange{{Topic: "apply", Partition: 7, From: 10, To: 20}, {Topic: "apply", Partition: 7, From: 30, To: 40}}
			}))
		}, []string{"[0, 100) in default/f/v1/backupmeta/00000000000000000001-1-c5.meta and [10, 20)", "[0, 100) in default/f/v1/backupmeta/00000000000000000001-1-c5.meta and [30, 40)"}},
		{"chunk past object end", 42, func(t *testing.T, b *sink.MemBucket, metas *[]string) {
			*metas = append(*metas, writeBackupWith(t, b, "c4", "none", evs[:1], func(m *sink.Meta) {
				m.Files[0].Offset += 1000
			}))
		}, []string{"exceeds the object"}},
		{"checkpoint behind", 43, nil, []string{"behind Redis"}},
		{"checkpoint ahead", 41, nil, []string{"went backwards"}},
		{"checkpoint missing", 42, func(t *testing.T, b *sink.MemBucket, metas *[]string) {
			b.Delete(ctx, ckpt)
		}, []string{"checkpoint object " + ckpt + " is missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := sink.NewMemBucket()
			metas := []string{
				writeBackupWith(t, b, "c1", "none", evs, offsets(0, 10)),
				writeBackupWith(t, b, "c2", "zstd", evs, func(m *sink.Meta) {
					m.Offsets = []sink.OffsetRange{{Topic: "apply", Partition: 0, From: 10, To: 20}}
				}),
			}
			cp := sink.EncodeCheckpoint(42)
			if err := b.Upload(ctx, sink.Object{Name: ckpt, Body: strings.NewReader(string(cp)), Size: 8, CRC32C: sink.CRC32C(cp)}); err != nil {
				t.Fatal(err)
			}
			if tc.mod != nil {
				tc.mod(t, b, &metas)
			}
			r, err := sink.Verify(ctx, sink.VerifyOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, Group: "flowlog", RedisCheckpoint: tc.redis})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Faults) != len(tc.faults) {
				t.Fatalf("faults %q, want %d matching %q", r.Faults, len(tc.faults), tc.faults)
			}
			for i, want := range tc.faults {
				if !strings.Contains(r.Faults[i], want) {
					t.Errorf("fault %q does not mention %q", r.Faults[i], want)
				}
			}
			if tc.faults == nil && (r.Chunks != 6 || r.Metas != 2 || r.DataObjects != 2 || r.CheckpointTS != 42 || !r.OK()) {
				t.Fatalf("clean report %+v", r)
			}
			if _, err := json.Marshal(r); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func metaOf(t *testing.T, b sink.Bucket, path string) sink.Meta {
	t.Helper()
	rc, err := b.Get(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var m sink.Meta
	if err := json.NewDecoder(rc).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestVerifyFlowObjects checks what Verify says about the objects under the
// flow's directory besides the backup: the checkpoint objects of other
// groups when the group's own is missing, and unreferenced objects, not
// counting those of another flow id of the same name that its listed metas
// reference.
func TestVerifyFlowObjects(t *testing.T) {
	ctx := context.Background()
	put := func(t *testing.T, b sink.Bucket, name string, body []byte) {
		t.Helper()
		if err := b.Upload(ctx, sink.Object{Name: name, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}); err != nil {
			t.Fatal(err)
		}
	}
	evs := []kv{wput(1, 1, 10, 9, "a")}
	b := sink.NewMemBucket()
	metas := []string{writeBackup(t, b, "c1", "zstd", evs)}
	// Leftovers of a fenced cycle: a data object and a meta never listed.
	put(t, b, "default/f/v1/20220307/07/1-fenced.log", make([]byte, 1000))
	put(t, b, "default/f/v1/backupmeta/00000000000000000001-fenced.meta", make([]byte, 24))
	// A dropped flow of the same name (id 9): one cycle listed, one not.
	var dropped []string
	for _, cycle := range []string{"d1", "d2"} {
		mp := writeBackupWith(t, b, cycle, "none", evs, func(m *sink.Meta) { m.FlowID = 9 })
		if cycle == "d1" {
			dropped = append(dropped, mp)
		}
	}
	d2 := metaOf(t, b, sink.MetaPath("", "default", "f", 1, 1, "d2"))
	d2Size, _ := b.Size(ctx, d2.DataPath)
	d2MetaSize, _ := b.Size(ctx, sink.MetaPath("", "default", "f", 1, 1, "d2"))
	// Another group's checkpoint, the dropped flow's, and an object outside
	// the flow.
	put(t, b, "default/f/v1/global_checkpoint/blue-1.ts", sink.EncodeCheckpoint(42))
	put(t, b, "default/f/v1/global_checkpoint/flowlog-9.ts", sink.EncodeCheckpoint(41))
	put(t, b, "default/g/v1/20220307/07/1-other.log", make([]byte, 5))

	listed := func(ctx context.Context, id uint32) ([]string, error) {
		if id != 9 {
			return nil, fmt.Errorf("unexpected flow id %d", id)
		}
		return dropped, nil
	}
	r, err := sink.Verify(ctx, sink.VerifyOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, Group: "flowlog", RedisCheckpoint: 42, ListedMetas: listed})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Faults) != 1 || !strings.Contains(r.Faults[0], "checkpoint object default/f/v1/global_checkpoint/flowlog-1.ts is missing (Redis has 42), but global_checkpoint/ holds default/f/v1/global_checkpoint/blue-1.ts, default/f/v1/global_checkpoint/flowlog-9.ts: is --group") {
		t.Errorf("faults %q, want the missing checkpoint naming the other groups'", r.Faults)
	}
	if fmt.Sprint(r.OtherCheckpoints) != "[default/f/v1/global_checkpoint/blue-1.ts default/f/v1/global_checkpoint/flowlog-9.ts]" {
		t.Errorf("other checkpoints %v", r.OtherCheckpoints)
	}
	if want := int64(1000+24) + d2Size + d2MetaSize; r.Unreferenced != 4 || r.UnreferencedBytes != want {
		t.Errorf("unreferenced %d objects, %d bytes; want 4, %d", r.Unreferenced, r.UnreferencedBytes, want)
	}

	// Without a Redis checkpoint and without other groups' objects, a
	// missing checkpoint object is no fault; without ListedMetas the
	// dropped flow's listed objects count too.
	b.Delete(ctx, "default/f/v1/global_checkpoint/blue-1.ts")
	b.Delete(ctx, "default/f/v1/global_checkpoint/flowlog-9.ts")
	r, err = sink.Verify(ctx, sink.VerifyOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, Group: "flowlog"})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || r.Unreferenced != 6 || len(r.OtherCheckpoints) != 0 {
		t.Errorf("report %+v, want OK with 6 unreferenced objects", r)
	}
}
