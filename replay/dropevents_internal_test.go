package replay

import (
	"runtime"
	"testing"
	"time"

	"github.com/flowlog/flowlog/event"
)

// A batch's events are slices of the chunk they were read from. Emptied
// for reuse, the batch must not keep that chunk alive: the read-ahead
// gives its budget back once the chunk is replayed, and a chunk of a large
// cycle is tens of MB.
func TestDropEventsReleasesTheChunk(t *testing.T) {
	freed := make(chan struct{})
	evs := func() []event.Event {
		chunk := make([]byte, 1<<20)
		runtime.SetFinalizer(&chunk[0], func(*byte) { close(freed) })
		return dropEvents([]event.Event{{Key: chunk[:10], Value: chunk[10:20]}, {Key: chunk[20:30]}})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		select {
		case <-freed:
			if len(evs) != 0 || cap(evs) < 2 {
				t.Fatalf("emptied events have length %d and capacity %d, want 0 and the old capacity", len(evs), cap(evs))
			}
			runtime.KeepAlive(evs)
			return
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			runtime.KeepAlive(evs)
			t.Fatal("the chunk is still reachable through the emptied events")
		}
	}
}
