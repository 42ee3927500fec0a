package gcs

import (
	"errors"
	"net/http"

	"google.golang.org/api/googleapi"

	"github.com/flowlog/flowlog/sink"
)

// IsRefusal reports whether err carries GCS's definite answer to a
// request: the bucket does not exist, or a 4xx status such as 401 or 403
// (no permission), which no retry changes. A failure to get an answer (a
// 5xx, a reset connection, a timeout, 408 or 429) is not a refusal: a
// retry may cure it.
func IsRefusal(err error) bool {
	if errors.Is(err, sink.ErrBucketNotExist) {
		return true
	}
	var g *googleapi.Error
	if !errors.As(err, &g) {
		return false
	}
	switch g.Code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests:
		return false
	}
	return g.Code >= 400 && g.Code < 500
}
