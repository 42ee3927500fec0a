package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/meta"
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
	fs := flag.NewFlagSet("consumer status", flag.ContinueOnError)
	var (
		conn   connConfig
		asJSON bool
	)
	conn.RegisterFlags(fs)
	fs.BoolVar(&asJSON, "json", false, "print JSON")
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
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
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
		var buf bytes.Buffer
		if json.Indent(&buf, rep.Consumer, "", "  ") == nil {
			fmt.Printf("\nconsumer at %s:\n%s\n", conn.HTTPAddr, buf.String())
		}
	}
	return nil
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
