package sink

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/flowlog/flowlog/event"
)

// TestAppendRaw checks appendRaw against event.DecodeBytes for raw keys of
// every length around the group size, including zero bytes that look like
// padding.
func TestAppendRaw(t *testing.T) {
	for n := range 26 {
		for _, fill := range []byte{0, 0xff, 'a'} {
			t.Run(fmt.Sprintf("%d-%x", n, fill), func(t *testing.T) {
				raw := bytes.Repeat([]byte{fill}, n)
				enc := event.EncodeBytes(nil, raw)
				want, _, err := event.DecodeBytes(enc)
				if err != nil {
					t.Fatal(err)
				}
				if got := appendRaw([]byte("x"), enc); !bytes.Equal(got, append([]byte("x"), want...)) {
					t.Fatalf("appendRaw = %x, want x%x", got, want)
				}
			})
		}
	}
}
