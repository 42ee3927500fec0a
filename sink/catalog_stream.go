package sink

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// CatalogEncoder writes a catalog's JSON part by part, so that a flow of
// 100,000 tables and its history never sit in memory whole: the head
// (NewCatalogEncoder), the current windows, the history and the pending
// steps in that order, then the tail (Close). Its bytes are those
// EncodeCatalog writes for the same catalog, and it checks what Validate
// checks as it goes (current windows must come in ascending table order).
type CatalogEncoder struct {
	w       io.Writer
	c       Catalog // the head and tail fields
	section int     // 0 windows, 1 history, 2 pending
	n       int     // elements written in the section
	last    uint32  // the last window's table id
	lastSeq uint64  // the last pending step's seq
	err     error
}

// catalogHead and catalogTail are Catalog's fields before the windows and
// after the pending steps, with the same tags.
type catalogHead struct {
	Version int                        `json:"version"`
	Group   string                     `json:"group"`
	FlowID  uint32                     `json:"flow_id"`
	Catalog string                     `json:"catalog"`
	Name    string                     `json:"name"`
	Rev     uint64                     `json:"rev"`
	Dropped bool                       `json:"dropped,omitempty"`
	Info    json.RawMessage            `json:"info"`
	Routes  map[string]json.RawMessage `json:"routes,omitempty"`
}

type catalogTail struct {
	CoverageSeq     uint64            `json:"coverage_seq,omitempty"`
	TruncatedBefore uint64            `json:"truncated_before,omitempty"`
	Snapshots       []CatalogSnapshot `json:"snapshots,omitempty"`
	CheckpointTS    uint64            `json:"checkpoint_ts"`
	DDL             *CatalogDDL       `json:"ddl,omitempty"`
}

// NewCatalogEncoder checks head (its Windows, History and Pending are
// ignored: they come through the encoder's methods) and writes the JSON up
// to the windows.
func NewCatalogEncoder(w io.Writer, head Catalog) (*CatalogEncoder, error) {
	head.Windows, head.History, head.Pending = nil, nil, nil
	if err := head.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(catalogHead{Version: head.Version, Group: head.Group, FlowID: head.FlowID, Catalog: head.Catalog,
		Name: head.Name, Rev: head.Rev, Dropped: head.Dropped, Info: head.Info, Routes: head.Routes})
	if err != nil {
		return nil, fmt.Errorf("encode catalog: %w", err)
	}
	e := &CatalogEncoder{w: w, c: head}
	e.write(b[:len(b)-1])
	e.write([]byte(`,"windows":[`))
	return e, e.err
}

func (e *CatalogEncoder) write(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}

// to moves the encoder on to section s, closing the ones before.
func (e *CatalogEncoder) to(s int) {
	for e.section < s {
		switch {
		case e.section == 0:
			e.write([]byte("]"))
		case e.n > 0:
			e.write([]byte("]"))
		}
		e.section++
		e.n = 0
	}
}

func (e *CatalogEncoder) element(s int, open string, v any) error {
	if e.err != nil {
		return e.err
	}
	if e.section > s {
		e.err = errors.New("encode catalog: parts out of order")
		return e.err
	}
	e.to(s)
	b, err := json.Marshal(v)
	if err != nil {
		e.err = fmt.Errorf("encode catalog: %w", err)
		return e.err
	}
	switch {
	case e.n == 0 && open != "":
		e.write([]byte(open))
	case e.n > 0:
		e.write([]byte(","))
	}
	e.write(b)
	e.n++
	return e.err
}

// Window writes the next current window; tables must ascend.
func (e *CatalogEncoder) Window(w CatalogWindow) error {
	if e.section == 0 && e.n > 0 && w.TableID <= e.last {
		e.err = fmt.Errorf("invalid catalog: windows: table %d after %d", w.TableID, e.last)
		return e.err
	}
	e.last = w.TableID
	return e.element(0, "", w)
}

// History writes the next earlier window.
func (e *CatalogEncoder) History(w CatalogWindow) error {
	return e.element(1, `,"history":[`, w)
}

// Pending writes the next pending step.
func (e *CatalogEncoder) Pending(p CatalogPending) error {
	switch {
	case len(p.Added) == 0 && len(p.Removed) == 0:
		e.err = fmt.Errorf("invalid catalog: pending step %d: no table", p.Seq)
	case !sortedUnique(p.Added) || !sortedUnique(p.Removed):
		e.err = fmt.Errorf("invalid catalog: pending step %d: tables not sorted or twice", p.Seq)
	case e.section == 2 && e.n > 0 && p.Seq <= e.lastSeq || p.Seq > e.c.CoverageSeq:
		e.err = fmt.Errorf("invalid catalog: pending step %d out of order or past coverage_seq %d", p.Seq, e.c.CoverageSeq)
	}
	if e.err != nil {
		return e.err
	}
	e.lastSeq = p.Seq
	return e.element(2, `,"pending":[`, p)
}

// Close writes the tail of the JSON. It does not close the writer.
func (e *CatalogEncoder) Close() error {
	if e.err != nil {
		return e.err
	}
	e.to(3)
	b, err := json.Marshal(catalogTail{CoverageSeq: e.c.CoverageSeq, TruncatedBefore: e.c.TruncatedBefore,
		Snapshots: e.c.Snapshots, CheckpointTS: e.c.CheckpointTS, DDL: e.c.DDL})
	if err != nil {
		return fmt.Errorf("encode catalog: %w", err)
	}
	e.write([]byte(","))
	e.write(b[1:])
	return e.err
}
