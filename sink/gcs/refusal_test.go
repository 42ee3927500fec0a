package gcs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/api/googleapi"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

func TestIsRefusal(t *testing.T) {
	status := func(code int) error {
		return fmt.Errorf("upload gs://b/x: %w", &googleapi.Error{Code: code, Message: "injected"})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no such bucket", fmt.Errorf("list: %w", sink.ErrBucketNotExist), true},
		{"403", status(403), true},
		{"401", status(401), true},
		{"400", status(400), true},
		{"408", status(408), false},
		{"429", status(429), false},
		{"503", status(503), false},
		{"500", status(500), false},
		{"reset", fmt.Errorf("upload: %w", errors.New("read tcp: connection reset by peer")), false},
		{"timeout", fmt.Errorf("upload: %w", context.DeadlineExceeded), false},
		{"eof", io.ErrUnexpectedEOF, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gcs.IsRefusal(tc.err); got != tc.want {
				t.Errorf("IsRefusal(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
