package sink_test

import (
	"testing"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

func TestMemBucketAcceptance(t *testing.T) {
	sinktest.AcceptanceTest(t, func(t *testing.T) sink.Bucket { return sink.NewMemBucket() }, sinktest.Options{})
}
