package sink

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// CatalogVersion is the version of the catalog JSON.
const CatalogVersion = 1

// MaxCatalogSize bounds a catalog object: a flow of 100,000 tables with
// their windows and a long history stays far below it.
const MaxCatalogSize = 256 << 20

// Catalog is what a flow's backup means, in the bucket itself: the flow's
// identity and definition, its coverage windows, its truncation point and
// listed snapshots, and the checkpoint and revision at which it was read
// from Redis. With the global checkpoint object and a listing of the metas
// it says what is restorable without Redis (docs/FORMAT.md, "Layout v2").
//
// Its content is a consistent read of the flow's Redis keys at revision Rev
// (catalog:rev:<flow_id>, which every change of that content increments);
// revisions only grow, and the highest revision listed is the catalog.
type Catalog struct {
	Version int    `json:"version"`
	Group   string `json:"group"`
	FlowID  uint32 `json:"flow_id"`
	Catalog string `json:"catalog"`
	Name    string `json:"name"`
	Rev     uint64 `json:"rev"`
	// Dropped marks a flow that no longer exists; Info and Routes are its
	// last definition.
	Dropped bool `json:"dropped,omitempty"`
	// Info is flow:info (FlowInfo JSON) and Routes flow:routes (partition
	// id -> Route JSON), as Redis held them.
	Info   json.RawMessage            `json:"info"`
	Routes map[string]json.RawMessage `json:"routes,omitempty"`
	// Windows are the tables' current coverage windows (coverage:<flow_id>)
	// and History the earlier ones (coverage:<flow_id>:past and the
	// :history list of earlier versions), oldest first within each table;
	// Pending are the steps still being established
	// (coverage:<flow_id>:pending, with the tables of their :step: keys)
	// and CoverageSeq their counter.
	Windows     []CatalogWindow  `json:"windows"`
	History     []CatalogWindow  `json:"history,omitempty"`
	Pending     []CatalogPending `json:"pending,omitempty"`
	CoverageSeq uint64           `json:"coverage_seq,omitempty"`
	// TruncatedBefore is truncated_before:<flow_id>, 0 if never truncated.
	TruncatedBefore uint64 `json:"truncated_before,omitempty"`
	// Snapshots are the listed snapshots (snapshots:<flow_id>), by ts.
	Snapshots []CatalogSnapshot `json:"snapshots,omitempty"`
	// CheckpointTS is the flow's checkpoint_ts when the catalog was read.
	CheckpointTS uint64 `json:"checkpoint_ts"`
	// DDL is where the last DDL record that changed the flow was applied:
	// its topic, partition and the next offset after it.
	DDL *CatalogDDL `json:"ddl,omitempty"`
}

// CatalogWindow is a table's coverage window: events with Since < ts <=
// Until, Until nil while open. A window with Until < Since holds no event
// (a table removed before any partition had seen past its addition).
type CatalogWindow struct {
	TableID uint32  `json:"table_id"`
	Since   uint64  `json:"since"`
	Until   *uint64 `json:"until"`
}

// CatalogPending is a pending coverage step: the tables one DDL added and
// removed, each sorted.
type CatalogPending struct {
	Seq     uint64   `json:"seq"`
	Added   []uint32 `json:"add,omitempty"`
	Removed []uint32 `json:"del,omitempty"`
}

// CatalogSnapshot is a listed snapshot: its ts and snapshot.meta path.
type CatalogSnapshot struct {
	TS   uint64 `json:"ts"`
	Path string `json:"path"`
}

// CatalogDDL is a position in the DDL topic.
type CatalogDDL struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Next      int64  `json:"next"`
}

// EncodeCatalog returns c as JSON, after checking it as DecodeCatalog does.
func EncodeCatalog(c Catalog) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Windows == nil {
		c.Windows = []CatalogWindow{}
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode catalog: %w", err)
	}
	return b, nil
}

// DecodeCatalog parses a catalog object and checks it.
func DecodeCatalog(b []byte) (Catalog, error) {
	if len(b) > MaxCatalogSize {
		return Catalog{}, fmt.Errorf("decode catalog: %d bytes, more than %d MiB", len(b), MaxCatalogSize>>20)
	}
	var c Catalog
	if err := json.Unmarshal(b, &c); err != nil {
		return Catalog{}, fmt.Errorf("decode catalog: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Catalog{}, err
	}
	return c, nil
}

// Validate checks that c is a version 1 catalog whose fields are
// consistent: valid names, a revision, one current window per table,
// pending steps in ascending order, each with a table, and snapshots in ts
// order.
func (c *Catalog) Validate() error {
	var errs []error
	if c.Version != CatalogVersion {
		errs = append(errs, fmt.Errorf("version %d, want %d", c.Version, CatalogVersion))
	}
	if !ValidName(c.Catalog) || !ValidName(c.Name) {
		errs = append(errs, fmt.Errorf("invalid flow %q/%q", c.Catalog, c.Name))
	}
	if c.Group == "" || c.Rev == 0 {
		errs = append(errs, errors.New("no group or revision"))
	}
	tables := make(map[uint32]bool, len(c.Windows))
	for i, w := range c.Windows {
		if tables[w.TableID] {
			errs = append(errs, fmt.Errorf("windows[%d]: table %d twice", i, w.TableID))
		}
		tables[w.TableID] = true
	}
	for i, p := range c.Pending {
		if len(p.Added) == 0 && len(p.Removed) == 0 {
			errs = append(errs, fmt.Errorf("pending[%d]: no table", i))
		}
		if !slices.IsSorted(p.Added) || !slices.IsSorted(p.Removed) {
			errs = append(errs, fmt.Errorf("pending[%d]: tables not sorted", i))
		}
		if i > 0 && p.Seq <= c.Pending[i-1].Seq || p.Seq > c.CoverageSeq {
			errs = append(errs, fmt.Errorf("pending[%d]: seq %d out of order or past coverage_seq %d", i, p.Seq, c.CoverageSeq))
		}
	}
	if !slices.IsSortedFunc(c.Snapshots, func(a, b CatalogSnapshot) int { return cmp.Compare(a.TS, b.TS) }) {
		errs = append(errs, errors.New("snapshots not in ts order"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid catalog: %w", err)
	}
	return nil
}
