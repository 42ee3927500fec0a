package event

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// WriteType is the kind of a TiKV write record.
type WriteType byte

// Write record types.
const (
	WritePut      WriteType = 'P'
	WriteDelete   WriteType = 'D'
	WriteLock     WriteType = 'L'
	WriteRollback WriteType = 'R'
)

// Flags of the optional fields that follow a write record's start ts.
const (
	flagShortValue         = 'v' // 1-byte length + value
	flagOverlappedRollback = 'R' // no payload
	flagGCFence            = 'F' // 8 bytes
	flagLastChange         = 'l' // 8 bytes + uvarint
	flagTxnSource          = 'S' // uvarint
)

// MaxShortValueLen is the longest value a write record can carry inline;
// longer values live in the default CF at the start ts.
const MaxShortValueLen = 255

// Write is a decoded write-CF value (TiKV write record). Fields TiKV keeps
// besides the short value are validated and skipped.
type Write struct {
	Type          WriteType
	StartTS       uint64
	ShortValue    []byte // aliases the decoded bytes
	HasShortValue bool
}

// Static details of write errors.
var (
	errWriteEmpty     = errors.New("write record is empty")
	errWriteType      = errors.New("write record has an unknown type")
	errWriteStartTS   = errors.New("write record start ts is truncated")
	errWriteTruncated = errors.New("write record field is truncated")
)

func validWriteType(t WriteType) bool {
	switch t {
	case WritePut, WriteDelete, WriteLock, WriteRollback:
		return true
	}
	return false
}

// DecodeWrite decodes a write-CF value: the type byte, the start ts as a
// uvarint, then flag-prefixed optional fields in any order, stopping at the
// first unknown flag. Errors are *DecodeError with Reason "write".
func DecodeWrite(v []byte) (Write, error) {
	var w Write
	if len(v) == 0 {
		return w, decodeErr(ReasonWrite, errWriteEmpty)
	}
	w.Type = WriteType(v[0])
	if !validWriteType(w.Type) {
		return Write{}, decodeErr(ReasonWrite, errWriteType)
	}
	ts, n := binary.Uvarint(v[1:])
	if n <= 0 {
		return Write{}, decodeErr(ReasonWrite, errWriteStartTS)
	}
	w.StartTS = ts
	rest := v[1+n:]
	for len(rest) > 0 {
		flag := rest[0]
		rest = rest[1:]
		ok := true
		switch flag {
		case flagShortValue:
			if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
				ok = false
				break
			}
			l := int(rest[0])
			w.ShortValue, w.HasShortValue = rest[1:1+l:1+l], true
			rest = rest[1+l:]
		case flagOverlappedRollback:
		case flagGCFence:
			ok = len(rest) >= 8
			if ok {
				rest = rest[8:]
			}
		case flagLastChange:
			ok = len(rest) >= 8
			if ok {
				rest, ok = skipUvarint(rest[8:])
			}
		case flagTxnSource:
			rest, ok = skipUvarint(rest)
		default:
			return w, nil
		}
		if !ok {
			return Write{}, decodeErr(ReasonWrite, errWriteTruncated)
		}
	}
	return w, nil
}

func skipUvarint(b []byte) ([]byte, bool) {
	_, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, false
	}
	return b[n:], true
}

// AppendWrite appends the encoding of w to dst: type, start ts and, when
// HasShortValue, the short value. It fails, leaving dst unchanged, for an
// unknown type or a short value longer than MaxShortValueLen.
func AppendWrite(dst []byte, w Write) ([]byte, error) {
	if !validWriteType(w.Type) {
		return dst, fmt.Errorf("append write record: unknown type %q", byte(w.Type))
	}
	if w.HasShortValue && len(w.ShortValue) > MaxShortValueLen {
		return dst, fmt.Errorf("append write record: short value of %d bytes exceeds %d", len(w.ShortValue), MaxShortValueLen)
	}
	dst = append(dst, byte(w.Type))
	dst = binary.AppendUvarint(dst, w.StartTS)
	if w.HasShortValue {
		dst = append(dst, flagShortValue, byte(len(w.ShortValue)))
		dst = append(dst, w.ShortValue...)
	}
	return dst, nil
}
