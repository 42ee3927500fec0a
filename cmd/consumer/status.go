package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
)

// partitionRow is one apply partition in `consumer status`.
type partitionRow struct {
	Topic        string `json:"topic"`
	Partition    int32  `json:"partition"`
	LeaseHolder  string `json:"lease_holder"`
	LeaseEpoch   int64  `json:"lease_epoch"`
	Offset       int64  `json:"offset"` // next offset committed in Redis, -1 if none
	EndOffset    int64  `json:"end_offset"`
	Lag          int64  `json:"lag"`
	CheckpointTS uint64 `json:"checkpoint_ts"`
}

type statusReport struct {
	Partitions []partitionRow  `json:"partitions"`
	Flows      []flowRow       `json:"flows"`
	Consumer   json.RawMessage `json:"consumer,omitempty"` // GET /status of --http-addr, if reachable
}

func runStatus(ctx context.Context, args []string) error {
	fs := newFlagSet("status")
	var (
		conn = connConfig{uses: useApplyTopic | useHTTP}
		out  output
	)
	conn.RegisterFlags(fs)
	out.RegisterFlags(fs)
	st, closeStore, err := conn.parseOpen(fs, args)
	if err != nil {
		return err
	}
	defer closeStore()
	opts, err := conn.Kafka.Opts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()

	var rep statusReport
	if rep.Partitions, err = partitionStatus(ctx, st, kadm.NewClient(cl), conn.Kafka.ApplyTopic); err != nil {
		return err
	}
	if rep.Flows, err = listFlows(ctx, st); err != nil {
		return err
	}
	addLogBytes(ctx, &conn, st, rep.Flows, 4)
	if conn.HTTPAddr != "" {
		rep.Consumer = fetchStatus(ctx, conn.HTTPAddr)
	}
	if out.json {
		return out.result(rep)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tLEASE HOLDER\tEPOCH\tREDIS OFFSET\tEND OFFSET\tLAG\tCHECKPOINT (UTC)")
	for _, p := range rep.Partitions {
		holder := p.LeaseHolder
		if holder == "" {
			holder = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%s\n", p.Topic, p.Partition, holder, p.LeaseEpoch, p.Offset, p.EndOffset, p.Lag, tsTime(p.CheckpointTS))
	}
	tw.Flush()
	fmt.Println()
	printFlows(rep.Flows)
	if rep.Consumer != nil {
		printConsumer(conn.HTTPAddr, rep.Consumer)
	} else if conn.HTTPAddr != "" {
		fmt.Printf("\nno consumer answered at --http-addr %s\n", conn.HTTPAddr)
	}
	return nil
}

// printConsumer prints the running consumer's /status (raw) in a few
// lines: what it holds now and its last cycle. The whole document is in
// `status --json`.
func printConsumer(addr string, raw json.RawMessage) {
	var s pipeline.Status
	if err := json.Unmarshal(raw, &s); err != nil {
		fmt.Printf("\nconsumer at %s: unreadable /status: %v\n", addr, err)
		return
	}
	state := "running"
	switch {
	case !s.Running:
		state = "not running"
	case s.Paused:
		state = "running, fetching paused (temp bytes at their bound)"
	}
	parts := make([]string, len(s.Partitions))
	var lag int64
	for i, p := range s.Partitions {
		parts[i], lag = strconv.Itoa(int(p.Partition)), lag+p.Lag
	}
	fmt.Printf("\nconsumer at %s: %s; partitions %s (lag %d records); temp %s; in flight %d cycles (%s)\n", addr, state,
		orNone(strings.Join(parts, ",")), lag, humanBytes(s.TempBytes), s.InflightCycles, humanBytes(s.InflightBytes))
	if c := s.LastCycle; !c.Finished.IsZero() {
		fmt.Printf("  last cycle %s (%s) committed %s: %d files, %s, %d flows, took %.2fs\n", c.ID, c.Trigger,
			c.Finished.UTC().Format(time.RFC3339), c.Files, humanBytes(c.Bytes), c.Flows, c.Duration)
	} else {
		fmt.Println("  no cycle committed yet")
	}
	for _, f := range s.Flows {
		if f.Fatal {
			fmt.Printf("  flow %s/%s (id %d) is FATAL: see docs/OPERATING.md, \"Recover a fatal flow\"\n", f.Catalog, f.Name, f.ID)
		}
	}
	if s.TSAheadSeconds >= 1 {
		fmt.Printf("  newest ts %.0fs ahead of this clock (--max-clock-skew %.0fs)\n", s.TSAheadSeconds, s.MaxClockSkewSeconds)
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// partitionStatus reads, per partition of the apply topic, the lease,
// Redis offset and checkpoint, and the Kafka end offset.
func partitionStatus(ctx context.Context, st *meta.Store, adm *kadm.Client, topic string) ([]partitionRow, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	var parts []int32
	for p := range ends[topic] {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	ckpts, _, err := st.PartitionCheckpoints(ctx, topic, parts)
	if err != nil {
		return nil, err
	}
	rows := make([]partitionRow, 0, len(parts))
	for _, p := range parts {
		end := ends[topic][p].Offset
		row := partitionRow{Topic: topic, Partition: p, Offset: -1, EndOffset: end, Lag: end, CheckpointTS: ckpts[p]}
		if l, ok, err := st.LeaseHolder(ctx, topic, p); err != nil {
			return nil, err
		} else if ok {
			row.LeaseHolder, row.LeaseEpoch = l.Member, l.Epoch
		}
		if off, ok, err := st.Offset(ctx, topic, p); err != nil {
			return nil, err
		} else if ok {
			row.Offset, row.Lag = off, max(end-off, 0)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// fetchStatus returns a running consumer's /status, or nil if it does not
// answer within a second.
func fetchStatus(ctx context.Context, addr string) json.RawMessage {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil || resp.StatusCode != http.StatusOK || !json.Valid(b) {
		return nil
	}
	return b
}
