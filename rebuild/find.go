package rebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/flowlog/flowlog/sink"
)

// FindBackup returns the name of the first object under prefix that is part
// of a flowlog backup: anything in the layout v2 tree (data, metas, the
// global checkpoint objects), or a data object, meta, catalog, checkpoint or
// snapshot in a flow directory (<prefix>/<catalog>/<flow>/v1/...). It
// returns "" when the prefix holds none. The listing stops at the first
// such object, so a prefix that holds a backup answers within its first
// objects; only a prefix of foreign objects is listed whole.
func FindBackup(ctx context.Context, b sink.Bucket, prefix string) (string, error) {
	dir := strings.TrimSuffix(prefix, "/")
	if dir != "" {
		dir += "/"
	}
	v2 := strings.TrimSuffix(sink.V2LogDir(prefix), "log/")
	var found string
	err := b.Iter(ctx, dir, func(name string) error {
		if isBackupObject(prefix, v2, name) {
			found = name
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return "", fmt.Errorf("list %s: %w", dir, err)
	}
	return found, nil
}

var errStop = errors.New("stop")

// isBackupObject reports whether name is one of flowlog's objects under
// prefix; v2 is <prefix>/v2/.
func isBackupObject(prefix, v2, name string) bool {
	if rest, ok := strings.CutPrefix(name, v2); ok {
		return strings.HasPrefix(rest, "log/") || strings.HasPrefix(rest, "meta/") || strings.HasPrefix(rest, "global_checkpoint/")
	}
	_, _, ok := sink.SplitFlowPath(prefix, name)
	return ok
}

func u32s(v uint32) string { return fmt.Sprint(v) }
