// Package buildinfo says which build of flowlog is running: the module
// version and the VCS revision the Go toolchain stamped into the binary
// (runtime/debug.ReadBuildInfo), for --version and the flowlog_build_info
// metric.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version, when set at link time (-ldflags "-X
// github.com/flowlog/flowlog/internal/buildinfo.version=v1.2.3"), replaces
// the module version: a release build names its release, and a test can
// tell two builds of one tree apart.
var version string

// Info is one build.
type Info struct {
	// Version is the module version ("v1.2.3", a pseudo-version from the
	// VCS, or "(devel)"), or the one set at link time.
	Version string `json:"version"`
	// Revision is the VCS revision the binary was built from, with
	// "-modified" when the work tree had uncommitted changes; "unknown"
	// when the build recorded none (go run, go test, -buildvcs=false).
	Revision string `json:"revision"`
	// Time is the commit time of Revision (RFC 3339), if recorded.
	Time string `json:"time,omitempty"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

// Get returns the running binary's build.
func Get() Info {
	info := Info{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			info.Version = bi.Main.Version
		}
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && info.Revision != "unknown" {
			info.Revision += "-modified"
		}
	}
	if version != "" {
		info.Version = version
	}
	return info
}

// String is the one line --version prints, after the command's name.
func (i Info) String() string {
	s := fmt.Sprintf("%s (revision %s", i.Version, i.Revision)
	if i.Time != "" {
		s += ", committed " + i.Time
	}
	return s + ", " + i.GoVersion + ")"
}

// Register registers flowlog_build_info on reg: a gauge of 1 whose labels
// name the build, so that a dashboard shows which version each replica runs
// (during a rolling upgrade, two).
func Register(reg prometheus.Registerer) {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "build_info",
		Help:        "Always 1; the labels name the running build: module version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	})
	g.Set(1)
	reg.MustRegister(g)
}
