package event

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestContentType(t *testing.T) {
	tests := []struct {
		name    string
		headers []kgo.RecordHeader
		want    string
	}{
		{"none", nil, ""},
		{"exact", []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/json")}}, "application/json"},
		{"case-insensitive key, first wins", []kgo.RecordHeader{
			{Key: "x", Value: []byte("y")},
			{Key: "Content-Type", Value: []byte("text/plain")},
			{Key: "content-type", Value: []byte("application/json")},
		}, "text/plain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ContentType(&kgo.Record{Headers: tc.headers}); got != tc.want {
				t.Fatalf("ContentType = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDLQRecord(t *testing.T) {
	src := &kgo.Record{
		Topic: "flowlog.apply", Partition: 3, Offset: 1234567890123,
		Key: []byte("17"), Value: []byte{0x08, 0x80},
		Headers: []kgo.RecordHeader{
			{Key: "content-type", Value: []byte("application/x-protobuf")},
			{Key: HeaderError, Value: []byte("old reason")},
		},
	}
	r := DLQRecord("flowlog.dlq", src, "proto: unexpected EOF")
	if r.Topic != "flowlog.dlq" || string(r.Key) != "17" || string(r.Value) != "\x08\x80" {
		t.Fatalf("DLQ record = %q/%q/%x", r.Topic, r.Key, r.Value)
	}
	want := []kgo.RecordHeader{
		{Key: "content-type", Value: []byte("application/x-protobuf")},
		{Key: HeaderSourceTopic, Value: []byte("flowlog.apply")},
		{Key: HeaderSourcePartition, Value: []byte("3")},
		{Key: HeaderSourceOffset, Value: []byte("1234567890123")},
		{Key: HeaderError, Value: []byte("proto: unexpected EOF")},
	}
	if len(r.Headers) != len(want) {
		t.Fatalf("headers = %v, want %v", r.Headers, want)
	}
	for i, h := range want {
		if r.Headers[i].Key != h.Key || string(r.Headers[i].Value) != string(h.Value) {
			t.Fatalf("header %d = %s: %q, want %s: %q", i, r.Headers[i].Key, r.Headers[i].Value, h.Key, h.Value)
		}
	}
	if len(src.Headers) != 2 {
		t.Fatal("DLQRecord changed the source record's headers")
	}
}
