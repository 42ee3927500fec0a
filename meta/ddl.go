package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
)

// DDL operations (the "op" field of a FlowDDL record).
const (
	OpCreate  = "create"
	OpReplace = "replace"
	OpDrop    = "drop"
	OpResume  = "resume"
)

// DefaultCatalog is the catalog of a flow whose DDL names none.
const DefaultCatalog = "default"

// DDL is a FlowDDL record of the DDL topic (docs/FORMAT.md, "FlowDDL
// records").
type DDL struct {
	Op          string           `json:"op"`
	Flow        FlowInfo         `json:"flow"`
	FlowID      *FlowID          `json:"flow_id,omitempty"`
	Routes      map[string]Route `json:"routes"`
	IfNotExists bool             `json:"if_not_exists"`
}

// ValidationError reports a DDL record that is malformed: which field and
// why.
type ValidationError struct {
	Field  string
	Reason string
}

// Error names the field and the reason.
func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid flow ddl: %s: %s", e.Field, e.Reason)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidName reports whether s is a valid catalog or flow name:
// [A-Za-z0-9_-]{1,128}. Names end up in object paths, so anything else (dots,
// slashes, escapes, unicode) is refused.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// ParseDDL decodes and validates a FlowDDL record value. It is strict:
// unknown fields, trailing data, unknown ops, invalid names, missing or zero
// source table ids (create and replace) and routes keys that are not
// canonical uint32 decimals are refused with a *ValidationError. An empty
// catalog becomes DefaultCatalog.
func ParseDDL(value []byte) (DDL, error) {
	var d DDL
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return DDL{}, &ValidationError{Field: "json", Reason: err.Error()}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return DDL{}, &ValidationError{Field: "json", Reason: "trailing data after the object"}
	}
	if err := d.normalize(); err != nil {
		return DDL{}, err
	}
	return d, nil
}

// normalize fills the default catalog and validates d.
func (d *DDL) normalize() error {
	switch d.Op {
	case OpCreate, OpReplace, OpDrop, OpResume:
	case "":
		return &ValidationError{Field: "op", Reason: "missing"}
	default:
		return &ValidationError{Field: "op", Reason: fmt.Sprintf("unknown op %q", d.Op)}
	}
	if d.Flow.CatalogName == "" {
		d.Flow.CatalogName = DefaultCatalog
	}
	if !ValidName(d.Flow.CatalogName) {
		return &ValidationError{Field: "flow.catalog_name", Reason: "must match [A-Za-z0-9_-]{1,128}"}
	}
	if !ValidName(d.Flow.FlowName) {
		return &ValidationError{Field: "flow.flow_name", Reason: "must match [A-Za-z0-9_-]{1,128}"}
	}
	if d.Op == OpDrop || d.Op == OpResume {
		return nil
	}
	if len(d.Flow.SourceTableIDs) == 0 {
		return &ValidationError{Field: "flow.source_table_ids", Reason: "at least one source table id is required"}
	}
	seen := map[uint32]bool{}
	for _, t := range d.Flow.SourceTableIDs {
		if t == 0 {
			return &ValidationError{Field: "flow.source_table_ids", Reason: "table id 0 is not valid"}
		}
		if seen[t] {
			return &ValidationError{Field: "flow.source_table_ids", Reason: fmt.Sprintf("table id %d listed twice", t)}
		}
		seen[t] = true
	}
	for k := range d.Routes {
		v, err := strconv.ParseUint(k, 10, 32)
		if err != nil || strconv.FormatUint(v, 10) != k {
			return &ValidationError{Field: "routes", Reason: fmt.Sprintf("key %q is not a uint32 partition id", k)}
		}
	}
	return nil
}

// routes returns d.Routes by partition id, completed with d.Flow's
// flownode_ids: a partition only in flownode_ids gets a route to its
// flownode, and a flow with neither gets partition 0 on flownode 0, so that
// every flow has at least one entry in its tables' index. It also fills
// the missing flownode_ids from the routes, on a copy.
func (d *DDL) routes() (FlowInfo, map[uint32]Route) {
	info := d.Flow
	info.FlownodeIDs = make(map[uint32]uint64, len(d.Flow.FlownodeIDs)+len(d.Routes))
	routes := make(map[uint32]Route, len(d.Routes)+len(d.Flow.FlownodeIDs))
	for k, r := range d.Routes {
		p, _ := strconv.ParseUint(k, 10, 32) // validated by normalize
		routes[uint32(p)] = r
		info.FlownodeIDs[uint32(p)] = r.Peer.ID
	}
	for p, n := range d.Flow.FlownodeIDs {
		info.FlownodeIDs[p] = n
		if _, ok := routes[p]; !ok {
			routes[p] = Route{Peer: Peer{ID: n}}
		}
	}
	if len(routes) == 0 {
		routes[0] = Route{Peer: Peer{ID: 0}}
		info.FlownodeIDs[0] = 0
	}
	return info, routes
}
