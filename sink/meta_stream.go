package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Streamed metas. A meta object may hold a million file entries in 64 MiB;
// a reader that decodes it whole holds all of them, and one that holds the
// metas of a flow holds that many times more. The readers here decode a
// meta member by member and its files one at a time, checking each as
// DecodeMeta would, and hand each file to the caller, which keeps what it
// needs: memory stays that of one file entry whatever the meta holds (see
// metaLexer for the bound on one entry).
//
// So that a file can be checked when it is read, "files" must be the last
// member of the meta object and "flows" must come before "coverage", as
// EncodeMeta writes them; a meta in another order is refused. Members may
// not repeat.

// metaParts says which of a v2 meta's partition commits and coverage
// reports a streamed read keeps, and whether its files keep the first
// keyPrefixHex hex digits of their start_key and end_key (keys, for a
// restore with a key range); they are checked either way.
type metaParts struct {
	partitions, coverage, keys bool
}

// metaVisitor is what a streamed read calls: header once, with the meta
// but its files (checked as far as it can be without them), before the
// first file or at the end when there is none; then file for each file, in
// order, after checking it. header may return errStopMeta to end the read
// there without error.
type metaVisitor struct {
	// member, if set, sees the meta after each member before files is
	// decoded (name is the member's), unchecked: it may return errStopMeta
	// to end the read there, as a listing that needs only a few members
	// does.
	member func(name string, m *Meta) error
	header func(m *Meta) error
	file   func(i int, f *FileMeta) error
}

// errStopMeta ends a streamed read after the header.
var errStopMeta = errors.New("stop")

// metaFields are the members of a meta object, in the order EncodeMeta
// writes them.
var metaFields = []string{"version", "flow", "flow_id", "store_id", "cycle_id", "group", "data_path",
	"min_ts", "max_ts", "min_resolved_ts", "flows", "offsets", "partitions", "coverage", "files"}

// metaField returns the member a JSON key names, matched as encoding/json
// matches struct fields (exactly, else case-insensitively), or "".
func metaField(key string) string {
	for _, f := range metaFields {
		if key == f {
			return f
		}
	}
	for _, f := range metaFields {
		if strings.EqualFold(key, f) {
			return f
		}
	}
	return ""
}

// visitError carries an error of a visitor through the decoder unchanged.
type visitError struct{ err error }

func (e *visitError) Error() string { return e.err.Error() }

// sourceReader records the first error of the object's reader other than
// io.EOF, so that a failed read is not mistaken for bad content.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && s.err == nil {
		s.err = err
	}
	return n, err
}

// streamMeta reads meta object path of b member by member (see the top of
// this file). A meta that does not decode or validate is a *badMetaError; a
// visitor's error is returned as is. It returns the meta without its files,
// its number of files and the object's size (of what was read, if the
// header stopped the read).
func streamMeta(ctx context.Context, b Bucket, path string, keep metaParts, v metaVisitor) (Meta, int, int64, error) {
	rc, err := b.Get(ctx, path)
	if err != nil {
		return Meta{}, 0, 0, fmt.Errorf("read meta: %w", err)
	}
	defer rc.Close()
	src := &sourceReader{r: rc}
	lx := newMetaLexer(src, keep.keys)
	m, n, err := decodeMetaStream(lx, keep, v)
	var ve *visitError
	switch {
	case err == nil:
		return m, n, lx.read, nil
	case errors.As(err, &ve):
		return m, n, lx.read, ve.err
	case src.err != nil:
		return m, n, lx.read, fmt.Errorf("read meta %s: %w", path, src.err)
	}
	return m, n, lx.read, &badMetaError{path: path, err: err}
}

// decodeMetaStream decodes a meta from r, calling v (see metaVisitor).
func decodeMetaStream(r io.Reader, keep metaParts, v metaVisitor) (m Meta, files int, err error) {
	dec := json.NewDecoder(r)
	if err := expectDelim(dec, '{'); err != nil {
		return m, 0, err
	}
	var (
		seen       = map[string]bool{}
		flowIDs    = map[uint32]bool{}
		v2Lists    bool // partitions or coverage seen, kept or not
		headerDone bool
	)
	header := func() error {
		headerDone = true
		if v1 := m.Version == MetaVersion; v1 && v2Lists {
			return errors.New("invalid meta: version 1 meta with version 2 fields")
		}
		if err := errors.Join(m.validateHeader(0)...); err != nil {
			return fmt.Errorf("invalid meta: %w", err)
		}
		if v.header != nil {
			if err := v.header(&m); err != nil {
				return &visitError{err}
			}
		}
		return nil
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return m, files, err
		}
		key, _ := tok.(string)
		name := metaField(key)
		if name != "" {
			if seen["files"] {
				return m, files, fmt.Errorf("member %q after files: files must be the last member", key)
			}
			if seen[name] {
				return m, files, fmt.Errorf("member %q twice", name)
			}
			seen[name] = true
		}
		switch name {
		case "version":
			err = dec.Decode(&m.Version)
		case "flow":
			err = dec.Decode(&m.Flow)
		case "flow_id":
			err = dec.Decode(&m.FlowID)
		case "store_id":
			err = dec.Decode(&m.StoreID)
		case "cycle_id":
			err = dec.Decode(&m.CycleID)
		case "group":
			err = dec.Decode(&m.Group)
		case "data_path":
			err = dec.Decode(&m.DataPath)
		case "min_ts":
			err = dec.Decode(&m.MinTS)
		case "max_ts":
			err = dec.Decode(&m.MaxTS)
		case "min_resolved_ts":
			err = dec.Decode(&m.MinResolvedTS)
		case "flows":
			_, err = decodeArray(dec, name, maxMetaFlows, func(i int) error {
				var f MetaFlow
				if err := decodeElem(dec, name, i, &f); err != nil {
					return err
				}
				m.Flows = append(m.Flows, f)
				return f.validate(i, flowIDs)
			})
		case "offsets":
			_, err = decodeArray(dec, name, maxMetaPartitions, func(i int) error {
				var o OffsetRange
				err := decodeElem(dec, name, i, &o)
				m.Offsets = append(m.Offsets, o)
				return err
			})
		case "partitions":
			_, err = decodeArray(dec, name, maxMetaPartitions, func(i int) error {
				var p PartitionState
				if err := decodeElem(dec, name, i, &p); err != nil {
					return err
				}
				v2Lists = true
				if keep.partitions {
					m.Partitions = append(m.Partitions, p)
				}
				return p.validate(i)
			})
		case "coverage":
			_, err = decodeArray(dec, name, maxMetaCoverage, func(i int) error {
				if !seen["flows"] {
					return errors.New("coverage before flows: flows must come first")
				}
				var c CoverageReport
				if err := decodeElem(dec, name, i, &c); err != nil {
					return err
				}
				v2Lists = true
				if keep.coverage {
					m.Coverage = append(m.Coverage, c)
				}
				return c.validate(i, flowIDs)
			})
		case "files":
			if err = header(); err != nil {
				break
			}
			fc := m.fileChecker()
			files, err = decodeArray(dec, name, maxMetaFiles, func(i int) error {
				var f FileMeta
				if err := decodeElem(dec, name, i, &f); err != nil {
					return err
				}
				if err := fc.check(i, &f); err != nil {
					return fmt.Errorf("invalid meta: %w", err)
				}
				if v.file != nil {
					if err := v.file(i, &f); err != nil {
						return &visitError{err}
					}
				}
				return nil
			})
		default:
			err = skipValue(dec)
		}
		if err == nil && name != "" && name != "files" && v.member != nil {
			if verr := v.member(name, &m); verr != nil {
				err = &visitError{verr}
			}
		}
		if err != nil {
			var ve *visitError
			if errors.As(err, &ve) && errors.Is(ve.err, errStopMeta) {
				return m, files, nil
			}
			return m, files, err
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return m, files, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return m, files, errors.New("data after the meta object")
	}
	if !headerDone {
		if err := header(); err != nil {
			var ve *visitError
			if errors.As(err, &ve) && errors.Is(ve.err, errStopMeta) {
				return m, files, nil
			}
			return m, files, err
		}
	}
	if err := errors.Join(m.validateFileCount(files)...); err != nil {
		return m, files, fmt.Errorf("invalid meta: %w", err)
	}
	return m, files, nil
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("want %q, found %v", want, tok)
	}
	return nil
}

// decodeArray reads an array (or null) of at most limit elements, calling
// elem to decode each.
func decodeArray(dec *json.Decoder, what string, limit int, elem func(i int) error) (int, error) {
	tok, err := dec.Token()
	if err != nil || tok == nil {
		return 0, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return 0, fmt.Errorf("%s: not an array", what)
	}
	n := 0
	for dec.More() {
		if n >= limit {
			return n, fmt.Errorf("%s: more than %d", what, limit)
		}
		if err := elem(n); err != nil {
			return n, err
		}
		n++
	}
	_, err = dec.Token()
	return n, err
}

// decodeElem decodes element i of array what into v.
func decodeElem(dec *json.Decoder, what string, i int, v any) error {
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s[%d]: %w", what, i, err)
	}
	return nil
}

// skipValue reads past the next value, token by token: an unknown member
// costs nothing to hold, however large.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}
