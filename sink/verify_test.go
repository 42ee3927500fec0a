package sink_test

import (
	"context"
	"encoding/json"
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
	const ckpt = "default/f/v1/global_checkpoint/flowlog.ts"
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
			r, err := sink.Verify(ctx, b, metas, ckpt, tc.redis)
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
