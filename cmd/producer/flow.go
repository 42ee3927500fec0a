package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/meta"
)

// flowMore is the rest of `producer flow -h`.
const flowMore = `Publishes one FlowDDL JSON record to the DDL topic (keyed by the flow name).
create and replace need --tables; drop and resume need only --name.
With --wait it then waits until a consumer applied or rejected it (reading
ddl:offset in Redis at --redis-url, and the DLQ) and exits 1 on a rejection.
`

// flowSpec is the FlowInfo part of a FlowDDL record; the consumer sets
// created_time and updated_time.
type flowSpec struct {
	CatalogName    string            `json:"catalog_name"`
	FlowName       string            `json:"flow_name"`
	SourceTableIDs []uint32          `json:"source_table_ids,omitempty"`
	SinkTableName  *meta.TableName   `json:"sink_table_name,omitempty"`
	FlownodeIDs    map[uint32]uint64 `json:"flownode_ids,omitempty"`
	RawSQL         string            `json:"raw_sql,omitempty"`
	Comment        string            `json:"comment,omitempty"`
}

// flowDDL is the FlowDDL JSON the consumer parses (docs/FORMAT.md,
// "FlowDDL records").
type flowDDL struct {
	Op          string                `json:"op"`
	Flow        flowSpec              `json:"flow"`
	FlowID      *uint32               `json:"flow_id,omitempty"`
	Routes      map[string]meta.Route `json:"routes,omitempty"`
	IfNotExists bool                  `json:"if_not_exists,omitempty"`
}

// runFlow is `producer flow <op> [flags]`.
func runFlow(ctx context.Context, args []string) error {
	return publishFlow(ctx, args, os.Stdout, os.Stderr)
}

// publishFlow parses args, publishes the DDL and reports where it landed
// on out; progress notes (a broker slow to answer) go to stderr.
func publishFlow(ctx context.Context, args []string, out, stderr io.Writer) error {
	fs := newFlagSet("flow")
	var kc kafkaconf.Config
	kc.RegisterFlagsFor(fs, kafkaconf.DDLTopic, kafkaconf.DLQTopic)
	var (
		name, catalog, sink, tables, comment, sql, routes string
		ifNotExists                                       bool
		flowID                                            *uint32
		timeout, waitTimeout                              time.Duration
		wait                                              bool
		rc                                                meta.Config
	)
	addTimeoutFlag(fs, &timeout)
	fs.BoolVar(&wait, "wait", false, "wait until a consumer applied or rejected the DDL (needs --redis-url); exit 1 if rejected")
	fs.DurationVar(&waitTimeout, "wait-timeout", 2*time.Minute, "with --wait, how long to wait for a consumer")
	rc.RegisterFlags(fs)
	fs.StringVar(&name, "name", "", "flow name, [A-Za-z0-9_-]{1,128} (required)")
	fs.StringVar(&catalog, "catalog", meta.DefaultCatalog, "catalog of the flow")
	fs.StringVar(&tables, "tables", "", "source table ids, comma separated (create, replace)")
	fs.StringVar(&sink, "sink", "", `sink table name in schema "public" (default "<name>_sink")`)
	fs.StringVar(&comment, "comment", "", "comment stored with the flow")
	fs.StringVar(&sql, "sql", "", "raw SQL stored with the flow")
	fs.BoolVar(&ifNotExists, "if-not-exists", false, "create: an existing flow of that name is a success")
	fs.StringVar(&routes, "routes", "", "flow partitions as partition=flownode@host:port, comma separated (default: partition 0 on flownode 0)")
	fs.Func("flow-id", "flow id to use (default: the next id, or the flow's own on replace)", func(s string) error {
		v, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return fmt.Errorf("not a uint32: %q", s)
		}
		id := uint32(v)
		flowID = &id
		return nil
	})

	var op string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		op, args = args[0], args[1:]
	}
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	// The operation may also come after some flags: take it, and parse the
	// flags that follow it (they override the environment, as flags do).
	for rest := fs.Args(); len(rest) > 0; rest = fs.Args() {
		if op != "" {
			return cli.Usagef("unexpected arguments %q", rest)
		}
		op = rest[0]
		if err := cli.Parse(fs, rest[1:]); err != nil {
			return err
		}
	}
	d, err := buildDDL(op, name, catalog, tables, sink, comment, sql, routes, ifNotExists, flowID)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	if err := kc.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	if timeout < 0 {
		return cli.Usagef("--timeout %v: must not be negative", timeout)
	}
	if wait {
		if err := cli.CheckURL("--redis-url", rc.URL); err != nil {
			return &cli.UsageError{Err: err}
		}
		if err := rc.Validate(); err != nil {
			return &cli.UsageError{Err: err}
		}
		if waitTimeout <= 0 {
			return cli.Usagef("--wait-timeout %v: must be positive", waitTimeout)
		}
	}
	value, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("encode flow ddl: %w", err)
	}
	cl, err := newProducer(&kc, timeout, stderr)
	if err != nil {
		return err
	}
	defer cl.Close()
	var waiter *ddlWaiter
	if wait {
		if waiter, err = newDDLWaiter(ctx, kc, rc, cl.Client, waitTimeout); err != nil {
			return err
		}
		defer waiter.Close()
	}
	rec := &kgo.Record{
		Topic:   kc.DDLTopic,
		Key:     []byte(name),
		Value:   value,
		Headers: []kgo.RecordHeader{{Key: event.HeaderContentType, Value: []byte("application/json")}},
	}
	acked, err := cl.publishSync(ctx, rec)
	if err != nil {
		return fmt.Errorf("publish %s of %s/%s to %s: %w", op, catalog, name, kc.DDLTopic, err)
	}
	got := acked[0]
	fmt.Fprintf(out, "published %s %s/%s at partition %d offset %d\n", op, catalog, name, got.Partition, got.Offset)
	if waiter == nil {
		return nil
	}
	if err := waiter.wait(ctx, got, stderr); err != nil {
		if errors.Is(err, ErrRejected) {
			fmt.Fprintf(out, "rejected %s %s/%s\n", op, catalog, name)
			return fmt.Errorf("%s of %s/%s %w", op, catalog, name, err)
		}
		return err
	}
	fmt.Fprintf(out, "applied %s %s/%s%s\n", op, catalog, name, waiter.flowIDText(ctx, catalog, name))
	return nil
}

// buildDDL validates the command line and assembles the record.
func buildDDL(op, name, catalog, tables, sink, comment, sql, routes string, ifNotExists bool, flowID *uint32) (flowDDL, error) {
	var errs []error
	switch op {
	case meta.OpCreate, meta.OpReplace, meta.OpDrop, meta.OpResume:
	case "":
		errs = append(errs, errors.New("missing operation: create, replace, drop or resume"))
	default:
		errs = append(errs, fmt.Errorf("unknown operation %q: want create, replace, drop or resume", op))
	}
	if !meta.ValidName(name) {
		errs = append(errs, fmt.Errorf("--name %q: must match [A-Za-z0-9_-]{1,128}", name))
	}
	if !meta.ValidName(catalog) {
		errs = append(errs, fmt.Errorf("--catalog %q: must match [A-Za-z0-9_-]{1,128}", catalog))
	}
	d := flowDDL{Op: op, Flow: flowSpec{CatalogName: catalog, FlowName: name}, FlowID: flowID, IfNotExists: ifNotExists}
	if op == meta.OpCreate || op == meta.OpReplace {
		ids, err := parseTableIDs(tables)
		if err != nil {
			errs = append(errs, err)
		}
		rs, nodes, err := parseRoutes(routes)
		if err != nil {
			errs = append(errs, err)
		}
		if sink == "" {
			sink = name + "_sink"
		}
		d.Flow.SourceTableIDs = ids
		d.Flow.SinkTableName = &meta.TableName{CatalogName: catalog, SchemaName: "public", TableName: sink}
		d.Flow.FlownodeIDs = nodes
		d.Flow.RawSQL, d.Flow.Comment = sql, comment
		d.Routes = rs
	}
	return d, errors.Join(errs...)
}

// parseTableIDs parses "1,2,3" into distinct non-zero uint32 table ids.
func parseTableIDs(s string) ([]uint32, error) {
	var ids []uint32
	seen := map[uint32]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil || v == 0 {
			return nil, fmt.Errorf("--tables: %q is not a table id (1..4294967295)", f)
		}
		if !seen[uint32(v)] {
			seen[uint32(v)] = true
			ids = append(ids, uint32(v))
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("--tables: at least one table id is required")
	}
	return ids, nil
}

// parseRoutes parses "0=1@host:port,1=2@host:port" into routes and
// flownode ids by partition; empty means partition 0 on flownode 0.
func parseRoutes(s string) (map[string]meta.Route, map[uint32]uint64, error) {
	routes, nodes := map[string]meta.Route{}, map[uint32]uint64{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		part, rest, ok := strings.Cut(f, "=")
		node, addr, _ := strings.Cut(rest, "@")
		p, perr := strconv.ParseUint(part, 10, 32)
		n, nerr := strconv.ParseUint(node, 10, 64)
		if !ok || perr != nil || nerr != nil {
			return nil, nil, fmt.Errorf("--routes: %q is not partition=flownode[@host:port]", f)
		}
		routes[strconv.FormatUint(p, 10)] = meta.Route{Peer: meta.Peer{ID: n, Addr: addr}}
		nodes[uint32(p)] = n
	}
	if len(routes) == 0 {
		routes["0"] = meta.Route{Peer: meta.Peer{ID: 0, Addr: ""}}
		nodes[0] = 0
	}
	return routes, nodes, nil
}
