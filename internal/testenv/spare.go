package testenv

import (
	"os"
	"reflect"
	"sync"
)

// spare is the broker started ahead for the next test of a package that
// asked for it (PrestartApacheKafka): a test package whose tests each start
// a broker, one after the other, gets each one already running while the
// test before it runs.
var spare struct {
	mu      sync.Mutex
	enabled bool
	next    chan *ApacheKafka // the broker being started, or nil
}

// PrestartApacheKafka makes every StartApacheKafka with a default
// configuration (only ApplyPartitions and Topics set) take a broker
// started ahead, and start the next one in the background; the first such
// call starts its own. Call StopApacheKafkaSpare when the package's tests
// are done (TestMain); a spare left running dies with the test binary
// anyway.
func PrestartApacheKafka() {
	spare.mu.Lock()
	defer spare.mu.Unlock()
	spare.enabled = true
}

// StopApacheKafkaSpare stops prestarting and stops the broker started
// ahead, if any.
func StopApacheKafkaSpare() {
	spare.mu.Lock()
	next := spare.next
	spare.enabled, spare.next = false, nil
	spare.mu.Unlock()
	if next != nil {
		if k := <-next; k != nil {
			k.Kill()
			_ = os.RemoveAll(k.dir)
		}
	}
}

// prestartLocked starts the next spare in the background; spare.mu held.
func prestartLocked() {
	next := make(chan *ApacheKafka, 1)
	spare.next = next
	go func() {
		dir, err := os.MkdirTemp("", "flowlog-kafka-")
		if err != nil {
			next <- nil
			return
		}
		k, err := launch(ApacheKafkaConfig{HeapMB: 512}, dir)
		if err != nil {
			_ = os.RemoveAll(dir)
			next <- nil
			return
		}
		next <- k
	}()
}

// takeSpare returns the broker started ahead if cfg is one it can serve
// (waiting for it to answer), and starts the next; nil otherwise. A spare
// that failed to start is nil too: the caller starts its own and reports
// the error.
func takeSpare(cfg ApacheKafkaConfig) *ApacheKafka {
	spare.mu.Lock()
	defer spare.mu.Unlock()
	base := cfg
	base.ApplyPartitions, base.Topics = 0, nil
	if !spare.enabled || !reflect.DeepEqual(base, ApacheKafkaConfig{HeapMB: 512}) {
		return nil
	}
	if spare.next == nil {
		prestartLocked()
		return nil
	}
	k := <-spare.next
	prestartLocked()
	if k == nil || !k.Running() {
		return nil
	}
	k.cfg = cfg
	return k
}
