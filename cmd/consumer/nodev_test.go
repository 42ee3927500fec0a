package main

import (
	"os/exec"
	"strings"
	"testing"
)

// devOnlyDeps are the packages that only `consumer dev` needs.
var devOnlyDeps = []string{"github.com/twmb/franz-go/pkg/kfake", "github.com/fsouza/fake-gcs-server/fakestorage",
	"github.com/alicebob/miniredis/v2", "github.com/yuin/gopher-lua"}

// TestNodevLeavesOutDevDeps checks that, built with -tags nodev, the
// consumer does not link the embedded Kafka, GCS emulator or Redis
// emulator, and built without it, it does: a production build carries no
// test servers.
func TestNodevLeavesOutDevDeps(t *testing.T) {
	deps := func(tags ...string) string {
		out, err := exec.Command("go", append(append([]string{"list", "-deps"}, tags...), ".")...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %v: %v\n%s", tags, err, out)
		}
		return "\n" + string(out)
	}
	nodev, full := deps("-tags", "nodev"), deps()
	for _, pkg := range devOnlyDeps {
		if strings.Contains(nodev, "\n"+pkg+"\n") {
			t.Errorf("-tags nodev links %s", pkg)
		}
		if !strings.Contains(full, "\n"+pkg+"\n") {
			t.Errorf("the default build does not link %s: dev lost its embedded services?", pkg)
		}
	}
}
