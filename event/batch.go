package event

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of apply.proto.
const (
	fieldRegionID   protowire.Number = 1
	fieldResolvedTS protowire.Number = 2
	fieldEvents     protowire.Number = 3

	fieldKey   protowire.Number = 1
	fieldValue protowire.Number = 2
	fieldCF    protowire.Number = 3
	fieldOp    protowire.Number = 4
)

// Batch is a decoded ApplyBatch: the committed mutations of one region.
// An empty Events is a heartbeat that only advances ResolvedTS.
type Batch struct {
	RegionID   uint64
	ResolvedTS uint64
	Events     []Event
}

// Event is one decoded ApplyEvent. After DecodeBatch of the protobuf form,
// Key and Value alias the decoded record's bytes.
type Event struct {
	Key   []byte // data key: memcomparable key + BE64(^ts) (docs/FORMAT.md, "Keys and timestamps")
	Value []byte
	CF    CF
	Op    Op
}

// IsJSON reports whether contentType selects the JSON form of ApplyBatch: its
// media type is application/json, compared case-insensitively, with
// parameters and surrounding spaces ignored.
func IsJSON(contentType string) bool {
	if i := strings.IndexByte(contentType, ';'); i >= 0 {
		contentType = contentType[:i]
	}
	return strings.EqualFold(strings.TrimSpace(contentType), "application/json")
}

// DecodeBatch decodes an apply record's value into b, in JSON form when
// IsJSON(contentType) and in protobuf form otherwise. It reuses the capacity
// of b.Events; in protobuf form it allocates nothing beyond growing b.Events,
// and event keys and values alias value; in JSON form they share one new
// buffer per call (in the usual spellings, json_fast.go). Unknown protobuf fields are skipped;
// unknown JSON fields are rejected. A cf or op outside the enums is an error.
// Every error is a *DecodeError; b's contents are unspecified after one.
func DecodeBatch(b *Batch, value []byte, contentType string) error {
	b.RegionID, b.ResolvedTS, b.Events = 0, 0, b.Events[:0]
	if IsJSON(contentType) {
		return decodeJSON(b, value)
	}
	if err := decodeProto(b, value); err != nil {
		return err
	}
	return nil
}

// decodeProto parses the protobuf wire form with last-one-wins scalars and
// unknown fields (including known numbers with an unexpected wire type)
// skipped, as proto.Unmarshal does.
func decodeProto(b *Batch, buf []byte) error {
	for len(buf) > 0 {
		num, typ, n := consumeTag(buf)
		if n < 0 {
			return protoErr("batch tag", n)
		}
		buf = buf[n:]
		switch {
		case num == fieldRegionID && typ == protowire.VarintType:
			b.RegionID, n = protowire.ConsumeVarint(buf)
		case num == fieldResolvedTS && typ == protowire.VarintType:
			b.ResolvedTS, n = protowire.ConsumeVarint(buf)
		case num == fieldEvents && typ == protowire.BytesType:
			var msg []byte
			msg, n = protowire.ConsumeBytes(buf)
			if n >= 0 {
				b.Events = append(b.Events, Event{})
				if err := decodeEventProto(&b.Events[len(b.Events)-1], msg); err != nil {
					return err
				}
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, buf)
		}
		if n < 0 {
			return protoErr("batch field", n)
		}
		buf = buf[n:]
	}
	return nil
}

func decodeEventProto(e *Event, buf []byte) error {
	var cf, op uint64
	for len(buf) > 0 {
		num, typ, n := consumeTag(buf)
		if n < 0 {
			return protoErr("event tag", n)
		}
		buf = buf[n:]
		switch {
		case num == fieldKey && typ == protowire.BytesType:
			e.Key, n = protowire.ConsumeBytes(buf)
		case num == fieldValue && typ == protowire.BytesType:
			e.Value, n = protowire.ConsumeBytes(buf)
		case num == fieldCF && typ == protowire.VarintType:
			cf, n = protowire.ConsumeVarint(buf)
		case num == fieldOp && typ == protowire.VarintType:
			op, n = protowire.ConsumeVarint(buf)
		default:
			n = protowire.ConsumeFieldValue(num, typ, buf)
		}
		if n < 0 {
			return protoErr("event field", n)
		}
		buf = buf[n:]
	}
	// Enums are int32 on the wire; truncate as proto.Unmarshal does.
	e.CF, e.Op = CF(int32(cf)), Op(int32(op))
	return checkEnums(e.CF, e.Op)
}

// consumeTag is protowire.ConsumeTag that also rejects field numbers above
// protowire.MaxValidNumber, as proto.Unmarshal does.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -2 // protowire's code for an invalid field number
	}
	return num, typ, n
}

// errBadCF and errBadOp are the details of enum errors; static so that the
// hot path does not format.
var (
	errBadCF = errors.New("cf is not a known column family")
	errBadOp = errors.New("op is not a known operation")
)

func checkEnums(cf CF, op Op) error {
	if cf < CFDefault || cf > CFLock {
		return decodeErr(ReasonCF, errBadCF)
	}
	if op < OpPut || op > OpDelete {
		return decodeErr(ReasonOp, errBadOp)
	}
	return nil
}

func protoErr(what string, n int) error {
	return decodeErr(ReasonProto, fmt.Errorf("%s: %w", what, protowire.ParseError(n)))
}

// decodeJSON decodes the JSON form: by decodeJSONFast when it can, else by
// protojson.Unmarshal (json_fast.go).
func decodeJSON(b *Batch, value []byte) error {
	if !decodeJSONFast(b, value) {
		b.RegionID, b.ResolvedTS, b.Events = 0, 0, b.Events[:0]
		var m ApplyBatch
		if err := protojson.Unmarshal(value, &m); err != nil {
			return decodeErr(ReasonJSON, err)
		}
		b.RegionID, b.ResolvedTS = m.RegionId, m.ResolvedTs
		for _, pe := range m.Events {
			b.Events = append(b.Events, Event{Key: pe.Key, Value: pe.Value, CF: pe.Cf, Op: pe.Op})
		}
	}
	for i := range b.Events {
		if err := checkEnums(b.Events[i].CF, b.Events[i].Op); err != nil {
			return err
		}
	}
	return nil
}

// EncodeBatch appends the protobuf wire form of b to dst, field for field as
// proto.Marshal writes it (zero scalars and empty bytes omitted).
func EncodeBatch(dst []byte, b *Batch) []byte {
	if b.RegionID != 0 {
		dst = protowire.AppendTag(dst, fieldRegionID, protowire.VarintType)
		dst = protowire.AppendVarint(dst, b.RegionID)
	}
	if b.ResolvedTS != 0 {
		dst = protowire.AppendTag(dst, fieldResolvedTS, protowire.VarintType)
		dst = protowire.AppendVarint(dst, b.ResolvedTS)
	}
	for i := range b.Events {
		e := &b.Events[i]
		dst = protowire.AppendTag(dst, fieldEvents, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(eventSize(e)))
		if len(e.Key) > 0 {
			dst = protowire.AppendTag(dst, fieldKey, protowire.BytesType)
			dst = protowire.AppendBytes(dst, e.Key)
		}
		if len(e.Value) > 0 {
			dst = protowire.AppendTag(dst, fieldValue, protowire.BytesType)
			dst = protowire.AppendBytes(dst, e.Value)
		}
		if e.CF != 0 {
			dst = protowire.AppendTag(dst, fieldCF, protowire.VarintType)
			dst = protowire.AppendVarint(dst, uint64(int64(e.CF)))
		}
		if e.Op != 0 {
			dst = protowire.AppendTag(dst, fieldOp, protowire.VarintType)
			dst = protowire.AppendVarint(dst, uint64(int64(e.Op)))
		}
	}
	return dst
}

// eventSize is the encoded size of an ApplyEvent message body; every tag
// of apply.proto is one byte.
func eventSize(e *Event) int {
	n := 0
	if len(e.Key) > 0 {
		n += 1 + protowire.SizeBytes(len(e.Key))
	}
	if len(e.Value) > 0 {
		n += 1 + protowire.SizeBytes(len(e.Value))
	}
	if e.CF != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(e.CF)))
	}
	if e.Op != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(e.Op)))
	}
	return n
}

// EncodeBatchJSON returns the protojson form of b, as a producer without
// protobuf support would write it.
func EncodeBatchJSON(b *Batch) ([]byte, error) {
	m := &ApplyBatch{RegionId: b.RegionID, ResolvedTs: b.ResolvedTS}
	if len(b.Events) > 0 {
		m.Events = make([]*ApplyEvent, len(b.Events))
		for i, e := range b.Events {
			m.Events[i] = &ApplyEvent{Key: e.Key, Value: e.Value, Cf: e.CF, Op: e.Op}
		}
	}
	out, err := protojson.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode apply batch json: %w", err)
	}
	return out, nil
}

// Short names for the generated enum values.
const (
	CFDefault = CF_CF_DEFAULT // default column family: values at start ts
	CFWrite   = CF_CF_WRITE   // write column family: write records at commit ts
	CFLock    = CF_CF_LOCK    // lock column family: skipped by the consumer
	OpPut     = Op_OP_PUT     // put
	OpDelete  = Op_OP_DELETE  // delete
)
