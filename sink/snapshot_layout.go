package sink

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Snapshot objects (docs/FORMAT.md, "Snapshot objects"):
//
//	<prefix>/<catalog>/<flow>/v1/snapshot/<ts:020d>-<flow_id>/<table_id>.snap    zstd chunks of framed entries sorted by key
//	<prefix>/<catalog>/<flow>/v1/snapshot/<ts:020d>-<flow_id>/snapshot.meta      SnapshotMeta JSON
//
// A snapshot counts only once its snapshot.meta is listed in Redis
// (meta.Store.AddSnapshot), after every object above is uploaded.

// SnapshotDir is the directory of flow id's snapshot at ts.
func SnapshotDir(prefix, catalog, flow string, flowID uint32, ts uint64) string {
	return fmt.Sprintf("%s/snapshot/%020d-%d", FlowDir(prefix, catalog, flow), ts, flowID)
}

// SnapshotMetaPath is the name of the snapshot.meta object of flow id's
// snapshot at ts.
func SnapshotMetaPath(prefix, catalog, flow string, flowID uint32, ts uint64) string {
	return SnapshotDir(prefix, catalog, flow, flowID, ts) + "/snapshot.meta"
}

// SnapshotTablePath is the name of the object holding one table of flow
// id's snapshot at ts.
func SnapshotTablePath(prefix, catalog, flow string, flowID uint32, ts uint64, tableID int64) string {
	return SnapshotDir(prefix, catalog, flow, flowID, ts) + "/" + strconv.FormatInt(tableID, 10) + ".snap"
}

// SnapshotMeta is the JSON of snapshot.meta.
type SnapshotMeta struct {
	Version int             `json:"version"` // 1
	Flow    string          `json:"flow"`    // "<catalog>/<flow>"
	FlowID  uint32          `json:"flow_id"`
	TS      uint64          `json:"ts"`
	Tables  []SnapshotTable `json:"tables"`
}

// SnapshotTable is one table of a snapshot: the coverage window its state
// was cut from and the chunks of its object.
type SnapshotTable struct {
	TableID  int64  `json:"table_id"`
	DataPath string `json:"data_path"` // full object name of the .snap object
	// Since and Until are the bounds of the window that held the snapshot
	// ts; Until is nil for a window still open when the snapshot was cut.
	Since  uint64          `json:"since"`
	Until  *uint64         `json:"until"`
	Chunks []SnapshotChunk `json:"chunks"`
}

// SnapshotChunk is one zstd frame of a .snap object, at [Offset,
// Offset+Length). Its entries are sorted by key, and chunks of the same
// kind (NoValue or not) follow each other in key order.
type SnapshotChunk struct {
	// NoValue marks a chunk of keys whose visible version at the
	// snapshot's ts is a put whose value was prewritten before the
	// window, so the backup does not hold it (a restore leaves them out
	// and counts them): entries with empty values. Such chunks are rare;
	// they may sit anywhere among the value chunks of the object.
	NoValue         bool   `json:"no_value,omitempty"`
	Offset          int64  `json:"offset"`
	Length          int64  `json:"length"`
	RawLength       int64  `json:"raw_length"`
	SHA256          string `json:"sha256"` // hex, of the uncompressed framed bytes
	NumberOfEntries int64  `json:"number_of_entries"`
	MinKey          string `json:"min_key"` // hex of the smallest data key
	MaxKey          string `json:"max_key"` // hex of the largest data key
}

// ErrBadSnapshotMeta is returned for a snapshot.meta that does not parse or
// is not consistent.
var ErrBadSnapshotMeta = errors.New("bad snapshot meta")

// EncodeSnapshotMeta returns m as JSON, after checking it as
// DecodeSnapshotMeta does.
func EncodeSnapshotMeta(m SnapshotMeta) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if m.Tables == nil {
		m.Tables = []SnapshotTable{}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot meta: %w", err)
	}
	return b, nil
}

// DecodeSnapshotMeta parses a snapshot.meta object and checks it.
func DecodeSnapshotMeta(b []byte) (SnapshotMeta, error) {
	var m SnapshotMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return SnapshotMeta{}, fmt.Errorf("%w: %w", ErrBadSnapshotMeta, err)
	}
	if err := m.Validate(); err != nil {
		return SnapshotMeta{}, err
	}
	return m, nil
}

// Validate checks that m is a version-1 snapshot meta whose chunks are
// well formed and do not overlap, and whose windows hold its ts.
func (m *SnapshotMeta) Validate() error {
	var errs []error
	if m.Version != 1 {
		errs = append(errs, fmt.Errorf("version %d, want 1", m.Version))
	}
	seen := make(map[int64]bool, len(m.Tables))
	for i, t := range m.Tables {
		if seen[t.TableID] {
			errs = append(errs, fmt.Errorf("table %d listed twice", t.TableID))
		}
		seen[t.TableID] = true
		if t.Since > m.TS || (t.Until != nil && *t.Until < m.TS) {
			errs = append(errs, fmt.Errorf("table %d: window does not hold ts %d", t.TableID, m.TS))
		}
		var end int64
		for j, c := range t.Chunks {
			switch {
			case c.Offset < end || c.Length <= 0 || c.RawLength < 0 || c.NumberOfEntries <= 0:
				errs = append(errs, fmt.Errorf("tables[%d].chunks[%d]: bad offset, length or count", i, j))
			case len(c.SHA256) != 64 || !isHex(c.SHA256) || !isHex(c.MinKey) || !isHex(c.MaxKey):
				errs = append(errs, fmt.Errorf("tables[%d].chunks[%d]: bad sha256 or key hex", i, j))
			}
			end = c.Offset + c.Length
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadSnapshotMeta, errors.Join(errs...))
	}
	return nil
}
