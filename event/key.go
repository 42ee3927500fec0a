package event

import (
	"encoding/binary"
	"errors"
)

// Memcomparable encoding (docs/FORMAT.md, "Keys and timestamps"): the raw key in groups of 8
// bytes, each padded with zeros to 8 bytes and followed by the marker
// 0xFF - pad. A final group is always written, so the encoding sorts
// exactly as the raw keys do and a prefix's encoding never equals another
// key's.
const (
	encGroupSize = 8
	encMarker    = 0xFF
	encPad       = 0x00
	// groupLen is the encoded size of one group.
	groupLen = encGroupSize + 1
	tsLen    = 8
)

// Static details of key errors, so that the hot path does not format.
var (
	errKeyTruncated = errors.New("encoded key is truncated")
	errKeyMarker    = errors.New("encoded key has an invalid group marker")
	errKeyPadding   = errors.New("encoded key has non-zero padding")
	errKeyTrailing  = errors.New("encoded key is not a whole number of groups")
	errKeyShort     = errors.New("data key is shorter than one group and a ts")
)

// EncodeBytes appends the memcomparable encoding of raw to dst.
func EncodeBytes(dst, raw []byte) []byte {
	for i := 0; i <= len(raw); i += encGroupSize {
		remain := len(raw) - i
		if remain >= encGroupSize {
			dst = append(dst, raw[i:i+encGroupSize]...)
			dst = append(dst, encMarker)
			continue
		}
		pad := encGroupSize - remain
		dst = append(dst, raw[i:]...)
		for range pad {
			dst = append(dst, encPad)
		}
		dst = append(dst, byte(encMarker-pad))
	}
	return dst
}

// EncodedLen returns the size of the memcomparable encoding of a raw key of
// rawLen bytes.
func EncodedLen(rawLen int) int {
	return (rawLen/encGroupSize + 1) * groupLen
}

// scanEncoded validates the memcomparable encoding at the start of enc and
// returns the raw length and the number of encoded bytes it spans.
func scanEncoded(enc []byte) (rawLen, n int, err error) {
	for {
		if len(enc)-n < groupLen {
			return 0, 0, errKeyTruncated
		}
		g := enc[n : n+groupLen]
		n += groupLen
		marker := g[encGroupSize]
		if marker == encMarker {
			rawLen += encGroupSize
			continue
		}
		pad := int(encMarker - marker)
		if pad > encGroupSize {
			return 0, 0, errKeyMarker
		}
		for _, c := range g[encGroupSize-pad : encGroupSize] {
			if c != encPad {
				return 0, 0, errKeyPadding
			}
		}
		return rawLen + encGroupSize - pad, n, nil
	}
}

// DecodeBytes decodes the memcomparable key at the start of enc. It returns
// the raw key (newly allocated) and the bytes after the encoding. Errors are
// *DecodeError with Reason "key".
func DecodeBytes(enc []byte) (raw, rest []byte, err error) {
	rawLen, n, err := scanEncoded(enc)
	if err != nil {
		return nil, nil, decodeErr(ReasonKey, err)
	}
	raw = make([]byte, 0, rawLen)
	for i := 0; i < n; i += groupLen {
		take := encGroupSize
		if left := rawLen - len(raw); left < take {
			take = left
		}
		raw = append(raw, enc[i:i+take]...)
	}
	return raw, enc[n:], nil
}

// AppendDataKey appends the data key of raw at ts to dst: the memcomparable
// encoding of raw followed by BE64(^ts).
func AppendDataKey(dst, raw []byte, ts uint64) []byte {
	dst = EncodeBytes(dst, raw)
	return binary.BigEndian.AppendUint64(dst, ^ts)
}

// SplitDataKey splits a data key into its encoded key (aliasing key) and its
// ts. It fails with a *DecodeError with Reason "key_ts" unless the key is a
// well-formed memcomparable encoding followed by exactly 8 ts bytes.
func SplitDataKey(key []byte) (encoded []byte, ts uint64, err error) {
	if len(key) < groupLen+tsLen {
		return nil, 0, decodeErr(ReasonKeyTS, errKeyShort)
	}
	encoded = key[:len(key)-tsLen]
	_, n, err := scanEncoded(encoded)
	if err != nil {
		return nil, 0, decodeErr(ReasonKeyTS, err)
	}
	if n != len(encoded) {
		return nil, 0, decodeErr(ReasonKeyTS, errKeyTrailing)
	}
	return encoded, ^binary.BigEndian.Uint64(key[len(encoded):]), nil
}

// DecodeDataKey returns the raw key and the ts of a data key. Errors are as
// for SplitDataKey.
func DecodeDataKey(key []byte) (raw []byte, ts uint64, err error) {
	encoded, ts, err := SplitDataKey(key)
	if err != nil {
		return nil, 0, err
	}
	raw, _, err = DecodeBytes(encoded)
	if err != nil {
		return nil, 0, err
	}
	return raw, ts, nil
}

// KeyKind classifies a key by what it belongs to.
type KeyKind uint8

// Key kinds returned by Classify.
const (
	KindOther KeyKind = iota // neither a table nor a meta key
	KindTable                // 't' + 8-byte table id + rest
	KindMeta                 // starts with 'm'
	// KindBadTable starts with the table prefix 't' but is too short to
	// hold the 8-byte table id: no flow can claim it, and dropping it
	// would hide a broken producer, so the record goes to the DLQ.
	KindBadTable
)

// String returns the kind's name.
func (k KeyKind) String() string {
	switch k {
	case KindTable:
		return "table"
	case KindMeta:
		return "meta"
	case KindBadTable:
		return "bad_table"
	default:
		return "other"
	}
}

const (
	tablePrefix = 't'
	metaPrefix  = 'm'
	signMask    = uint64(1) << 63
)

// Classify tells table keys from meta keys and everything else, looking only
// at the first two groups of an encoded key (a data key works as well). It
// does not allocate. tableID is set for KindTable only.
func Classify(encoded []byte) (kind KeyKind, tableID int64) {
	if len(encoded) < groupLen {
		return KindOther, 0
	}
	marker := encoded[encGroupSize]
	// The first group must hold at least one raw byte.
	if marker < encMarker-encGroupSize+1 {
		return KindOther, 0
	}
	switch encoded[0] {
	case metaPrefix:
		return KindMeta, 0
	case tablePrefix:
		// 't' + 8 id bytes: a full first group and at least one byte in
		// the second.
		if marker != encMarker || len(encoded) < 2*groupLen ||
			encoded[2*groupLen-1] < encMarker-encGroupSize+1 {
			return KindBadTable, 0
		}
		var id [8]byte
		copy(id[:7], encoded[1:encGroupSize])
		id[7] = encoded[groupLen]
		return KindTable, int64(binary.BigEndian.Uint64(id[:]) ^ signMask)
	}
	return KindOther, 0
}

// TablePrefix returns the raw key prefix of a table: 't' + BE64(id ^ 1<<63).
func TablePrefix(tableID int64) []byte {
	b := make([]byte, 0, 9)
	b = append(b, tablePrefix)
	return binary.BigEndian.AppendUint64(b, uint64(tableID)^signMask)
}

// RowKey returns the raw key of a row: TablePrefix + "_r" + BE64(handle ^ 1<<63).
func RowKey(tableID, handle int64) []byte {
	b := make([]byte, 0, 19)
	b = append(b, tablePrefix)
	b = binary.BigEndian.AppendUint64(b, uint64(tableID)^signMask)
	b = append(b, '_', 'r')
	return binary.BigEndian.AppendUint64(b, uint64(handle)^signMask)
}

// TableIDOfRaw returns the table id of a raw table key.
func TableIDOfRaw(raw []byte) (int64, bool) {
	if len(raw) < 9 || raw[0] != tablePrefix {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(raw[1:9]) ^ signMask), true
}
