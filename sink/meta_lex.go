package sink

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// metaLexer bounds what a JSON decoder reading a meta object has to hold.
// A meta may be 64 MiB, and encoding/json buffers a whole value before it
// decodes it: one giant string, a run of whitespace or an element of a
// thousand unknown members would each be held at once, several times over.
// The lexer passes the JSON through with these changes, so that the
// decoder after it holds little:
//
//   - whitespace outside strings is dropped;
//   - the hex values of start_key and end_key of the elements of files are
//     checked as they stream (lowercase hex, an even count, no escapes)
//     and passed on as "", or, for a reader that asks for keys, cut to
//     their first keyPrefixHex characters: a data key may be as large as
//     --max-value-size, only a restore with a key range needs them, and it
//     needs only a prefix to tell a chunk that cannot hold a key of the
//     range (KeyRange.OverlapsChunk treats every key as a possible prefix);
//   - any other string longer than maxMetaString, a number or literal
//     longer than maxMetaScalar, nesting deeper than maxMetaDepth, or an
//     array element of more than maxMetaElement bytes is an error;
//   - more than maxMetaSize bytes in all is an error.
//
// It does not check the JSON's syntax: the decoder after it does.
type metaLexer struct {
	src  *bufio.Reader
	read int64 // bytes read from src
	// keyHex is how much of an elided member's hex is passed on: 0, or
	// keyPrefixHex.
	keyHex int

	stack []lexLevel // open objects and arrays
	// Inside a string: its length so far, whether it is a key (and its
	// first bytes, to match), whether it is elided, and a pending escape.
	inString bool
	isKey    bool
	elide    bool
	escape   bool
	strLen   int
	key      []byte
	keyOver  bool // the key is longer than key's capacity: no match
	// elideNext is set by a key that names an elided member, for its value;
	// inFiles while the top-level member being passed is "files".
	elideNext bool
	inFiles   bool
	scalar    int   // length of the number or literal being passed
	elemBytes int64 // bytes passed of the current array element at depth 3+

	err error
}

// lexLevel is one open object ('{', expecting a key when key is set) or
// array ('[').
type lexLevel struct {
	kind byte
	key  bool
}

const (
	maxMetaString  = 64 << 10
	maxMetaScalar  = 64
	maxMetaDepth   = 16
	maxMetaElement = 4 << 20
)

// elidedKeys are the members whose string values the lexer checks and
// drops.
var elidedKeys = [][]byte{[]byte("start_key"), []byte("end_key")}

// keyPrefixHex is how much of an elided member's hex is passed on to a
// reader that asks for keys: 256
// bytes of a data key, far more than a row or index key's encoding, so that
// a cut key is rare and costs at most a chunk read that a whole key would
// have skipped.
const keyPrefixHex = 512

// newMetaLexer lexes r; keys passes on a prefix of the files' keys.
func newMetaLexer(r io.Reader, keys bool) *metaLexer {
	l := &metaLexer{src: bufio.NewReaderSize(r, 64<<10), key: make([]byte, 0, 16)}
	if keys {
		l.keyHex = keyPrefixHex
	}
	return l
}

// errMetaTooLarge is a meta object over maxMetaSize.
var errMetaTooLarge = fmt.Errorf("larger than %d MiB", maxMetaSize>>20)

func (l *metaLexer) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && l.err == nil {
		if _, err := l.src.Peek(1); err != nil {
			l.err = err
			break
		}
		buf, _ := l.src.Peek(l.src.Buffered())
		used := 0
		for used < len(buf) && n < len(p) && l.err == nil {
			if k, out := l.span(buf[used:], p[n:]); k > 0 {
				if l.count(k) {
					used += k
					n += out
				}
				continue
			}
			c := buf[used]
			used++
			if !l.count(1) {
				break
			}
			emit, err := l.next(c)
			if err != nil {
				l.err = fmt.Errorf("at byte %d: %w", l.read, err)
				break
			}
			if emit {
				if !l.element(1) {
					break
				}
				p[n] = c
				n++
			}
		}
		if _, err := l.src.Discard(used); err != nil && l.err == nil {
			l.err = err
		}
	}
	if n > 0 {
		return n, nil
	}
	return 0, l.err
}

// span passes on at once, from in to out, the run of plain bytes that
// starts a string's rest (no quote, no backslash), checked as stringByte
// checks them one by one, and returns its length and how many bytes it
// wrote to out (0, 0: no such run, or the bytes need the slow path).
// Elided bytes past keyHex are checked, not copied.
func (l *metaLexer) span(in, out []byte) (int, int) {
	if !l.inString {
		k := l.scalarSpan(in, out)
		return k, k
	}
	if l.escape || l.isKey {
		return 0, 0
	}
	k := 0
	if l.elide {
		for k < len(in) && isLowerHex(in[k]) {
			k++
		}
		if l.strLen >= l.keyHex {
			l.strLen += k
			return k, 0
		}
		// The prefix passed on: no more than out holds.
		k = min(k, l.keyHex-l.strLen, len(out))
		if k == 0 || !l.element(k) {
			return 0, 0
		}
		copy(out, in[:k])
		l.strLen += k
		return k, k
	}
	k = min(len(in), len(out), maxMetaString-l.strLen)
	if i := bytes.IndexAny(in[:k], "\"\\"); i >= 0 {
		k = i
	}
	if k == 0 || !l.element(k) {
		return 0, 0
	}
	copy(out, in[:k])
	l.strLen += k
	return k, k
}

func isLowerHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

// scalarSpan is span for the bytes of a number or literal outside strings.
func (l *metaLexer) scalarSpan(in, out []byte) int {
	k := 0
	for k < len(in) && k < len(out) && isScalarByte(in[k]) {
		k++
	}
	if k == 0 || l.scalar+k > maxMetaScalar || !l.element(k) {
		return 0 // none, or next reports the error
	}
	l.scalar += k
	l.elideNext = false
	copy(out, in[:k])
	return k
}

// isScalarByte reports whether c belongs to a number or literal: anything
// but whitespace, a quote and the structural characters.
func isScalarByte(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '"', '{', '[', '}', ']', ':', ',':
		return false
	}
	return true
}

// count adds k bytes read, and reports false (setting l.err) past
// maxMetaSize.
func (l *metaLexer) count(k int) bool {
	if l.read += int64(k); l.read > maxMetaSize {
		l.err = errMetaTooLarge
		return false
	}
	return true
}

// element adds k bytes passed on to the current array element, and
// reports false (setting l.err) past maxMetaElement.
func (l *metaLexer) element(k int) bool {
	if len(l.stack) < 3 {
		return true
	}
	if l.elemBytes += int64(k); l.elemBytes > maxMetaElement {
		l.err = fmt.Errorf("at byte %d: an array element of more than %d MiB", l.read, maxMetaElement>>20)
		return false
	}
	return true
}

// next takes byte c and reports whether it is passed on.
func (l *metaLexer) next(c byte) (bool, error) {
	if l.inString {
		return l.stringByte(c)
	}
	if isScalarByte(c) {
		if l.scalar++; l.scalar > maxMetaScalar {
			return false, fmt.Errorf("a number or literal of more than %d bytes", maxMetaScalar)
		}
		l.elideNext = false
		return true, nil
	}
	l.scalar = 0
	top := len(l.stack) - 1
	switch c {
	case ' ', '\t', '\n', '\r':
		return false, nil
	case '"':
		l.inString, l.strLen, l.escape = true, 0, false
		l.isKey = top >= 0 && l.stack[top].kind == '{' && l.stack[top].key
		l.elide = !l.isKey && l.elideNext
		l.elideNext = false
		l.key, l.keyOver = l.key[:0], false
	case '{', '[':
		if len(l.stack) >= maxMetaDepth {
			return false, fmt.Errorf("nested deeper than %d", maxMetaDepth)
		}
		if len(l.stack) == 2 {
			l.elemBytes = 0 // an element of a top-level member's array
		}
		l.stack = append(l.stack, lexLevel{kind: c, key: c == '{'})
		l.elideNext = false
	case '}', ']':
		if top < 0 || l.stack[top].kind != c-2 { // '{'+2 == '}', '['+2 == ']'
			return false, errors.New("unbalanced brackets")
		}
		l.stack = l.stack[:top]
	case ':':
		if top >= 0 && l.stack[top].kind == '{' {
			l.stack[top].key = false
		}
	case ',':
		if top >= 0 && l.stack[top].kind == '{' {
			l.stack[top].key = true
		}
		l.elideNext = false
	}
	return true, nil
}

// stringByte takes byte c inside a string.
func (l *metaLexer) stringByte(c byte) (bool, error) {
	switch {
	case l.escape:
		l.escape = false
	case c == '"':
		l.inString = false
		if l.elide && l.strLen%2 != 0 {
			return false, fmt.Errorf("a key of odd hex length %d", l.strLen)
		}
		if l.isKey && len(l.stack) == 1 {
			l.inFiles = !l.keyOver && bytes.EqualFold(l.key, []byte("files"))
		}
		if l.isKey && !l.keyOver && len(l.stack) == 3 && l.inFiles {
			for _, k := range elidedKeys {
				if bytes.EqualFold(l.key, k) {
					l.elideNext = true
				}
			}
		}
		return true, nil
	case c == '\\':
		if l.elide {
			return false, errors.New("an escape in a hex key")
		}
		l.escape = true
	}
	l.strLen++
	if l.elide {
		if !isLowerHex(c) {
			return false, fmt.Errorf("a key that is not lowercase hex (%q)", c)
		}
		return l.strLen <= l.keyHex, nil
	}
	if l.strLen > maxMetaString {
		return false, fmt.Errorf("a string of more than %d KiB", maxMetaString>>10)
	}
	if l.isKey {
		if len(l.key) < cap(l.key) {
			l.key = append(l.key, c)
		} else {
			l.keyOver = true
		}
	}
	return true, nil
}
