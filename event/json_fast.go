package event

import (
	"encoding/base64"
	"math"
)

// The JSON form of ApplyBatch is protojson, and protojson.Unmarshal is the
// authority on it: what it accepts, with what result, and what it rejects.
// It is also slow for this message (about 40 MB/s here) and allocates a
// string or slice per field, so that a topic of small JSON events spent
// most of the consumer's CPU in protojson and the garbage collector, and
// its peak RSS passed its memory target. decodeJSONFast decodes the
// spellings producers write (protojson's own output, either field name
// form, integers as numbers or strings, enums as names or numbers, padded
// standard base64) without a per-event allocation: the decoded keys and
// values share one buffer per record. It gives up on anything else
// (escapes in strings, null, exponents, signs, leading zeros, URL-safe or
// unpadded base64, unknown or repeated fields, trailing bytes, ...), and
// decodeJSON then asks protojson. So it only ever returns what protojson
// would have returned for the same bytes; FuzzDecodeJSONFast and
// TestDecodeJSONFastMatchesProtojson check that.

// jsonParser is a cursor over one record's JSON value.
type jsonParser struct {
	s     []byte
	i     int
	arena []byte // decoded bytes; its capacity never grows, so slices of it stay valid
}

// decodeJSONFast decodes value into b (whose fields are zero and Events
// empty) and reports whether it could. When it could not, b holds partial
// results and the caller decodes again with protojson.
func decodeJSONFast(b *Batch, value []byte) bool {
	// Every decoded key and value comes from a base64 string of value, of
	// at most 3/4 of its length, so value's length is room enough.
	p := jsonParser{s: value, arena: make([]byte, 0, len(value))}
	if !p.object(func(name []byte) bool {
		switch string(name) {
		case "region_id", "regionId":
			return p.uint64(&b.RegionID)
		case "resolved_ts", "resolvedTs":
			return p.uint64(&b.ResolvedTS)
		case "events":
			return p.events(b)
		}
		return false
	}) {
		return false
	}
	p.ws()
	return p.i == len(p.s)
}

// fieldNames maps a field name of ApplyBatch or ApplyEvent to a bit, so
// that object can tell a field given twice under either of its names.
func fieldNames(name []byte) uint {
	switch string(name) {
	case "region_id", "regionId":
		return 1
	case "resolved_ts", "resolvedTs":
		return 2
	case "events":
		return 4
	case "key":
		return 8
	case "value":
		return 16
	case "cf":
		return 32
	case "op":
		return 64
	}
	return 0
}

// object parses a JSON object, calling field for each member with the
// cursor at its value. It fails on a name fieldNames does not know or a
// field given twice (it does not check that the name belongs to this
// object's message: field does).
func (p *jsonParser) object(field func(name []byte) bool) bool {
	p.ws()
	if !p.byte('{') {
		return false
	}
	p.ws()
	if p.byte('}') {
		return true
	}
	var seen uint
	for {
		p.ws()
		name, ok := p.plainString()
		if !ok {
			return false
		}
		f := fieldNames(name)
		if f == 0 || seen&f != 0 {
			return false
		}
		seen |= f
		p.ws()
		if !p.byte(':') {
			return false
		}
		p.ws()
		if !field(name) {
			return false
		}
		p.ws()
		if p.byte('}') {
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}

// events parses the events array into b.Events.
func (p *jsonParser) events(b *Batch) bool {
	if !p.byte('[') {
		return false
	}
	p.ws()
	if p.byte(']') {
		return true
	}
	for {
		b.Events = append(b.Events, Event{})
		e := &b.Events[len(b.Events)-1]
		var cf, op int32
		if !p.object(func(name []byte) bool {
			switch string(name) {
			case "key":
				return p.bytes(&e.Key)
			case "value":
				return p.bytes(&e.Value)
			case "cf":
				return p.enum(&cf, cfNames)
			case "op":
				return p.enum(&op, opNames)
			}
			return false
		}) {
			return false
		}
		e.CF, e.Op = CF(cf), Op(op)
		p.ws()
		if p.byte(']') {
			return true
		}
		if !p.byte(',') {
			return false
		}
		p.ws()
	}
}

var (
	cfNames = map[string]int32{"CF_DEFAULT": 0, "CF_WRITE": 1, "CF_LOCK": 2}
	opNames = map[string]int32{"OP_PUT": 0, "OP_DELETE": 1}
)

// enum parses an enum value: one of names, or a number within int32 (an
// unknown number is decoded, as protojson does, and rejected by
// checkEnums). A negative number is left to protojson.
func (p *jsonParser) enum(v *int32, names map[string]int32) bool {
	if p.i < len(p.s) && p.s[p.i] == '"' {
		name, ok := p.plainString()
		if !ok {
			return false
		}
		n, ok := names[string(name)]
		*v = n
		return ok
	}
	n, ok := p.digits()
	if !ok || n > math.MaxInt32 {
		return false
	}
	*v = int32(n)
	return true
}

// uint64 parses an integer given as a number or as a string of digits.
func (p *jsonParser) uint64(v *uint64) bool {
	quoted := p.byte('"')
	n, ok := p.digits()
	if !ok || quoted && !p.byte('"') {
		return false
	}
	*v = n
	return true
}

// digits parses a non-negative integer without leading zeros that fits in
// a uint64, and requires that what follows cannot continue a JSON number
// (no fraction or exponent).
func (p *jsonParser) digits() (uint64, bool) {
	start := p.i
	var n uint64
	for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
		d := uint64(p.s[p.i] - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
		p.i++
	}
	switch {
	case p.i == start, p.s[start] == '0' && p.i-start > 1:
		return 0, false
	case p.i < len(p.s) && (p.s[p.i] == '.' || p.s[p.i] == 'e' || p.s[p.i] == 'E'):
		return 0, false
	}
	return n, true
}

// bytes parses a string of padded standard base64 and decodes it into the
// arena; v aliases the arena.
func (p *jsonParser) bytes(v *[]byte) bool {
	s, ok := p.plainString()
	if !ok || len(s)%4 != 0 {
		return false
	}
	// StdEncoding rejects every byte outside its alphabet and padding but
	// \r and \n, which plainString does not pass: URL-safe base64 ('-',
	// '_') goes to protojson, as it decides between the two by them.
	start := len(p.arena)
	dst := p.arena[start : start+base64.StdEncoding.DecodedLen(len(s))]
	n, err := base64.StdEncoding.Decode(dst, s)
	if err != nil {
		return false
	}
	p.arena = p.arena[:start+n]
	*v = p.arena[start : start+n : start+n]
	return true
}

// plainString parses a JSON string of printable ASCII without escapes and
// returns its contents, aliasing the input.
func (p *jsonParser) plainString() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return p.s[start : p.i-1], true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

// byte consumes c if it is next.
func (p *jsonParser) byte(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// ws skips JSON whitespace.
func (p *jsonParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}
