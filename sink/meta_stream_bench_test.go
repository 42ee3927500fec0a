package sink

import (
	"bytes"
	"strings"
	"testing"
)

// BenchmarkStreamMeta streams a meta of 20,000 files with 42-byte keys
// (about 550 bytes of JSON per file), the shape of the crafted metas of the
// hostile-input tests: the MB/s a reader goes through metas at.
func BenchmarkStreamMeta(b *testing.B) {
	m := v1Meta()
	f := m.Files[0]
	key := strings.Repeat("7480", 21)
	m.Files = nil
	for i := range 20000 {
		f.Offset, f.StartKey, f.EndKey = int64(i)*16, key, key
		m.Files = append(m.Files, f)
	}
	raw, err := EncodeMeta(m)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		n := 0
		if _, _, err := decodeMetaStream(newMetaLexer(bytes.NewReader(raw), false), metaParts{}, metaVisitor{file: func(int, *FileMeta) error { n++; return nil }}); err != nil || n != 20000 {
			b.Fatal(n, err)
		}
	}
}
