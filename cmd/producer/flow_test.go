package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

func TestRunFlowPublishes(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := uint32(42)
	cases := []struct {
		name string
		args []string
		want meta.DDL
	}{
		{"create with defaults", []string{"create", "--name", "orders", "--tables", "1, 2"}, meta.DDL{
			Op: "create",
			Flow: meta.FlowInfo{CatalogName: "default", FlowName: "orders", SourceTableIDs: []uint32{1, 2},
				SinkTableName: meta.TableName{CatalogName: "default", SchemaName: "public", TableName: "orders_sink"},
				FlownodeIDs:   map[uint32]uint64{0: 0}},
			Routes: map[string]meta.Route{"0": {Peer: meta.Peer{ID: 0, Addr: ""}}},
		}},
		{"replace with everything", []string{"replace", "--name", "f", "--catalog", "c", "--tables", "3", "--sink", "s",
			"--comment", "hi", "--flow-id", "42", "--if-not-exists", "--routes", "0=1@h1:1,1=2@h2:2"}, meta.DDL{
			Op: "replace",
			Flow: meta.FlowInfo{CatalogName: "c", FlowName: "f", SourceTableIDs: []uint32{3},
				SinkTableName: meta.TableName{CatalogName: "c", SchemaName: "public", TableName: "s"},
				FlownodeIDs:   map[uint32]uint64{0: 1, 1: 2}, Comment: "hi"},
			FlowID:      &id,
			Routes:      map[string]meta.Route{"0": {Peer: meta.Peer{ID: 1, Addr: "h1:1"}}, "1": {Peer: meta.Peer{ID: 2, Addr: "h2:2"}}},
			IfNotExists: true,
		}},
		{"drop", []string{"drop", "--name", "orders"}, meta.DDL{
			Op: "drop", Flow: meta.FlowInfo{CatalogName: "default", FlowName: "orders"}}},
		{"resume, op after flags", []string{"--name", "orders", "--catalog", "x", "resume"}, meta.DDL{
			Op: "resume", Flow: meta.FlowInfo{CatalogName: "x", FlowName: "orders"}}},
	}
	cl := k.Client(t, kgo.ConsumeTopics(testenv.DDLTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			args := append([]string{}, tc.args...)
			args = append(args, "--brokers", k.Brokers())
			if err := publishFlow(ctx, args, &out, io.Discard); err != nil {
				t.Fatalf("publishFlow: %v", err)
			}
			wantOut := fmt.Sprintf("published %s %s/%s at partition 0 offset %d\n", tc.want.Op, tc.want.Flow.CatalogName, tc.want.Flow.FlowName, i)
			if out.String() != wantOut {
				t.Errorf("output %q, want %q", out.String(), wantOut)
			}
			fs := cl.PollRecords(ctx, 1)
			if err := ctx.Err(); err != nil || len(fs.Records()) != 1 {
				t.Fatalf("read back: %v, %d records", err, len(fs.Records()))
			}
			r := fs.Records()[0]
			if string(r.Key) != tc.want.Flow.FlowName || r.Offset != int64(i) {
				t.Errorf("key %q offset %d", r.Key, r.Offset)
			}
			if ct := event.ContentType(r); ct != "application/json" {
				t.Errorf("content-type %q", ct)
			}
			got, err := meta.ParseDDL(r.Value)
			if err != nil {
				t.Fatalf("ParseDDL(%s): %v", r.Value, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("published %s\nparsed  %+v\nwant    %+v", r.Value, got, tc.want)
			}
		})
	}
}

func TestRunFlowRejects(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no op", []string{"--name", "f"}, "missing operation"},
		{"unknown op", []string{"alter", "--name", "f", "--tables", "1"}, "unknown operation"},
		{"bad name", []string{"create", "--name", "../x", "--tables", "1"}, "--name"},
		{"no tables", []string{"create", "--name", "f"}, "--tables"},
		{"table zero", []string{"create", "--name", "f", "--tables", "0"}, "--tables"},
		{"bad route", []string{"create", "--name", "f", "--tables", "1", "--routes", "x"}, "--routes"},
		{"bad flow id", []string{"create", "--name", "f", "--tables", "1", "--flow-id", "-1"}, "flow-id"},
		{"two ops", []string{"create", "--name", "f", "--tables", "1", "drop"}, "unexpected arguments"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := publishFlow(context.Background(), append(tc.args, "--brokers", "127.0.0.1:1"), &out, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
			if out.Len() != 0 {
				t.Errorf("printed %q", out.String())
			}
		})
	}
}
