package backup

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/flowlog/flowlog/sink"
)

// Selection is the part of a flow's backup a reader asks for: some of its
// tables, and within them a half-open range [StartKey, EndKey) of raw keys
// (docs/RESTORE.md, "Selective restore"). The zero Selection is the whole
// flow.
//
// It is the one selection of every command that reads a backup out: a
// restore takes it in RestoreRequest, and a replay into Kafka is meant to
// take the same value and apply it the same way, so that a selection
// restores and replays the same keys. A reader applies it in three places:
// the tables (HasTable, also before the coverage windows are consulted, so
// a table outside the selection is neither restored nor reported as left
// out), the chunks it reads (Keys().OverlapsChunk on a chunk's start_key and
// end_key, or a snapshot chunk's min_key and max_key: a chunk that cannot
// hold a selected key is never fetched), and each key (HasKey on the raw
// key, since a chunk that overlaps the range may hold keys outside it).
// A snapshot takes no Selection: it is cut of whole tables, which truncate
// relies on (docs/RESTORE.md, "Selective restore", says why).
type Selection struct {
	// Tables are the table ids selected; nil means every table of the flow.
	Tables map[int64]bool
	// StartKey and EndKey bound the raw keys selected, [StartKey, EndKey);
	// nil (or empty) is unbounded on that side.
	StartKey, EndKey []byte
}

// ErrEmptySelection is wrapped by Validate for a selection that can hold no
// key: a start key not before the end key, a key range that holds no table
// key, or a table of Tables none of whose keys lies in the key range.
var ErrEmptySelection = errors.New("the selection holds no key")

// Validate checks that s can hold keys: StartKey before EndKey, a range
// that holds table keys, and every table of Tables with a key in the
// range. The error wraps ErrEmptySelection.
func (s Selection) Validate() error {
	if err := s.Keys().Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrEmptySelection, err)
	}
	if !s.Keys().HoldsTableKeys() {
		return fmt.Errorf("%w: no table key lies in [%x, %x) (table keys start with 74, then the 8-byte table id)", ErrEmptySelection, s.StartKey, s.EndKey)
	}
	var out []int64
	for id, ok := range s.Tables {
		if ok && !s.Keys().HoldsTable(id) {
			out = append(out, id)
		}
	}
	if len(out) > 0 {
		slices.Sort(out)
		return fmt.Errorf("%w: table %s has no key in [%x, %x)", ErrEmptySelection, joinIDs(out), s.StartKey, s.EndKey)
	}
	return nil
}

// Keys is the selection's key range.
func (s Selection) Keys() sink.KeyRange { return sink.KeyRange{Start: s.StartKey, End: s.EndKey} }

// HasTable reports whether table id is selected: listed in Tables (or
// Tables is nil) and with a key in the key range.
func (s Selection) HasTable(id int64) bool {
	return (s.Tables == nil || s.Tables[id]) && s.Keys().HoldsTable(id)
}

// HasKey reports whether the raw key lies in the key range. (Its table is
// HasTable's question.)
func (s Selection) HasKey(raw []byte) bool { return s.Keys().Holds(raw) }

// All reports whether s selects the whole flow.
func (s Selection) All() bool { return s.Tables == nil && s.Keys().All() }

func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ",")
}

// SelectionFlags is a Selection as command-line flags: --tables, --start-key
// and --end-key. Every command that takes a Selection registers it, so the
// flags read the same everywhere.
type SelectionFlags struct {
	Tables   string // comma-separated table ids
	StartKey string // hex raw key
	EndKey   string // hex raw key
}

// RegisterFlags registers --tables, --start-key and --end-key on f.
func (c *SelectionFlags) RegisterFlags(f *flag.FlagSet) {
	f.StringVar(&c.Tables, "tables", "", "comma-separated table ids to read (default: all)")
	f.StringVar(&c.StartKey, "start-key", "", "read only raw keys at or after this one, in hex (default: from the first key)")
	f.StringVar(&c.EndKey, "end-key", "", "read only raw keys before this one, in hex; the range is half-open (default: to the last key)")
}

// Validate checks that the flags parse into a selection that can hold keys.
func (c *SelectionFlags) Validate() error {
	_, err := c.Selection()
	return err
}

// Selection parses the flags. Errors name the flag.
func (c *SelectionFlags) Selection() (Selection, error) {
	var s Selection
	if c.Tables != "" {
		s.Tables = map[int64]bool{}
		for _, t := range strings.Split(c.Tables, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
			if err != nil {
				return Selection{}, fmt.Errorf("--tables: %q is not a table id", t)
			}
			s.Tables[id] = true
		}
	}
	var err error
	if s.StartKey, err = hexKey("--start-key", c.StartKey); err != nil {
		return Selection{}, err
	}
	if s.EndKey, err = hexKey("--end-key", c.EndKey); err != nil {
		return Selection{}, err
	}
	if err := s.Keys().Validate(); err != nil {
		return Selection{}, fmt.Errorf("--start-key %s is not before --end-key %s: the range [start, end) holds no key", c.StartKey, c.EndKey)
	}
	if err := s.Validate(); err != nil {
		if c.Tables == "" {
			return Selection{}, fmt.Errorf("--start-key/--end-key: %w", err)
		}
		return Selection{}, fmt.Errorf("--tables %s and --start-key/--end-key: %w", c.Tables, err)
	}
	return s, nil
}

// hexKey decodes a key flag's hex; "" is no bound.
func hexKey(name, v string) ([]byte, error) {
	if v == "" {
		return nil, nil
	}
	b, err := hex.DecodeString(strings.TrimPrefix(strings.ToLower(v), "0x"))
	if err != nil {
		return nil, fmt.Errorf("%s: %q is not a hex raw key (%v)", name, v, err)
	}
	return b, nil
}
