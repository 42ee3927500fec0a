// Package meta keeps flowlog's metadata in Redis: flows (GreptimeDB's flow
// metadata model), the DDL applier that changes them, the in-memory flow
// registry the router reads, and the offsets, leases, checkpoints and
// manifests of the exactly-once commit. docs/FORMAT.md describes every key
// ("Redis keys") and the rules they serve ("Flow metadata transactions",
// "Commit protocol", "Checkpoint rule", "Coverage rule").
package meta

import "time"

// FlowID identifies a flow; ids come from the flow:seq counter.
type FlowID = uint32

// TableName names a flow's sink table.
type TableName struct {
	CatalogName string `json:"catalog_name"`
	SchemaName  string `json:"schema_name"`
	TableName   string `json:"table_name"`
}

// FlowInfo is a flow's definition, stored as JSON at flow:info:<id>.
type FlowInfo struct {
	CatalogName      string            `json:"catalog_name"`
	FlowName         string            `json:"flow_name"`
	SourceTableIDs   []uint32          `json:"source_table_ids"`
	SinkTableName    TableName         `json:"sink_table_name"`
	FlownodeIDs      map[uint32]uint64 `json:"flownode_ids"` // partition id -> flownode id
	RawSQL           string            `json:"raw_sql"`
	ExpireAfterSecs  *int64            `json:"expire_after_secs"`
	EvalIntervalSecs *int64            `json:"eval_interval_secs"`
	Comment          string            `json:"comment"`
	Options          map[string]string `json:"options"`
	CreatedTime      time.Time         `json:"created_time"`
	UpdatedTime      time.Time         `json:"updated_time"`
}

// Peer is the flownode serving one partition of a flow.
type Peer struct {
	ID   uint64 `json:"id"`
	Addr string `json:"addr"`
}

// Route places one partition of a flow on a peer.
type Route struct {
	Peer Peer `json:"peer"`
}

// Flow state values stored in flow:state's status field.
const (
	StatusActive = "active"
	StatusFatal  = "fatal"
)
