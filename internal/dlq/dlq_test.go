package dlq_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/internal/testenv"
)

func TestSend(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg := prometheus.NewRegistry()
	w := dlq.New(k.Client(t), testenv.DLQTopic, reg)
	w.InitReasons("bad_json", "no_ts")
	if got := counters(t, reg); len(got) != 2 || got["bad_json"] != 0 || got["no_ts"] != 0 {
		t.Fatalf("series after InitReasons = %v, want bad_json and no_ts at 0", got)
	}

	cases := []struct {
		name, reason, detail, wantErr string
		src                           *kgo.Record
	}{
		{"with detail", "bad_json", "unexpected EOF", "bad_json: unexpected EOF",
			&kgo.Record{Topic: "flowlog.ddl", Partition: 0, Offset: 7, Key: []byte("k1"), Value: []byte("{")}},
		{"no detail", "no_ts", "", "no_ts",
			&kgo.Record{Topic: "flowlog.apply", Partition: 3, Offset: 123456789012, Key: nil, Value: []byte{0, 1, 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := w.Send(ctx, tc.src, tc.reason, tc.detail); err != nil {
				t.Fatalf("Send: %v", err)
			}
		})
	}

	cl := k.Client(t, kgo.ConsumeTopics(testenv.DLQTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []*kgo.Record
	for len(got) < len(cases) {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("poll: %v (got %d records)", err, len(got))
		}
		got = append(got, fs.Records()...)
	}
	for i, tc := range cases {
		r := got[i]
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		want := map[string]string{
			event.HeaderSourceTopic:     tc.src.Topic,
			event.HeaderSourcePartition: strconv.Itoa(int(tc.src.Partition)),
			event.HeaderSourceOffset:    strconv.FormatInt(tc.src.Offset, 10),
			event.HeaderError:           tc.wantErr,
		}
		for k, v := range want {
			if h[k] != v {
				t.Errorf("%s: header %s = %q, want %q", tc.name, k, h[k], v)
			}
		}
		if string(r.Key) != string(tc.src.Key) || string(r.Value) != string(tc.src.Value) {
			t.Errorf("%s: key/value = %q/%q, want %q/%q", tc.name, r.Key, r.Value, tc.src.Key, tc.src.Value)
		}
	}
	if got := counters(t, reg); got["bad_json"] != 1 || got["no_ts"] != 1 {
		t.Errorf("dlq_records_total = %v, want 1 per reason", got)
	}
}

// counters returns flowlog_dlq_records_total by reason.
func counters(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "flowlog_dlq_records_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
