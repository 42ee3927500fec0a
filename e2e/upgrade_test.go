package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
)

// upgradeFrom is the earlier version the upgrade scenario runs beside this
// tree's: the main branch's head before --version, build info and the
// current command-line rules (its formats and Redis keys are those of
// docs/FORMAT.md's layout v1; this tree writes layout v2 by default and
// continues the earlier build's v1 backup in it).
// Move it forward to the last release once releases are tagged.
const upgradeFrom = "aa2fd4d49d208ed0b93ee416f67651b8a8298f65"

// buildConsumerAt builds cmd/consumer of commit rev into dir. The source
// comes from `git archive` (not a git worktree: the repository's own
// worktree list stays as it was, even if the test is killed). It returns
// "" and why when the commit is not in this clone's history (a shallow
// clone).
func buildConsumerAt(t *testing.T, rev, dir string) (string, string) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("git", "-C", root, "archive", rev)
	var tarball, stderr bytes.Buffer
	archive.Stdout, archive.Stderr = &tarball, &stderr
	if err := archive.Run(); err != nil {
		return "", fmt.Sprintf("git archive %s: %v: %s", rev[:12], err, strings.TrimSpace(stderr.String()))
	}
	untar := exec.Command("tar", "-x", "-C", src)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("untar %s: %v\n%s", rev[:12], err, out)
	}
	return buildConsumer(t, src, filepath.Join(dir, "consumer-"+rev[:12])), ""
}

// buildConsumer builds ./cmd/consumer of the module at src into out, with
// extra go build flags.
func buildConsumer(t *testing.T, src, out string, extra ...string) string {
	t.Helper()
	cmd := exec.Command("go", append(append([]string{"build", "-o", out}, extra...), "./cmd/consumer")...)
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", src, err, b)
	}
	return out
}

// buildInfo is the flowlog_build_info line of a consumer's /metrics, "" if
// it has none (a build older than the metric).
func buildInfo(t *testing.T, p *proc) string {
	t.Helper()
	resp, err := http.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		t.Fatalf("%s /metrics: %v", p.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "flowlog_build_info{") {
			return line
		}
	}
	return ""
}

// TestRollingUpgradeMixedGroup is a rolling upgrade of a two-replica group
// from the earlier version upgradeFrom to this tree, under load: two old
// replicas back up a first load; one is stopped and replaced by a new one,
// and the group of one old and one new replica, each holding partitions,
// backs up a second load; then the last old one is replaced and a third
// load goes in. The backup must be complete and exact (restore equals the
// loads' state, verify is clean, no entry or offset range twice), and the
// old build's restore reads what the new one wrote (the new replicas run
// with --layout v1, as an upgrade that keeps a rollback window does): a
// rollback keeps a readable backup.
//
// When this clone has no history (a shallow clone), the old replicas are
// this tree built again with another version stamped in (-ldflags -X), so
// that the group still runs two builds; the test log says which it ran.
func TestRollingUpgradeMixedGroup(t *testing.T) {
	dir := t.TempDir()
	newBin := binary(t, "consumer")
	oldBin, why := buildConsumerAt(t, upgradeFrom, dir)
	oldVersion := "commit " + upgradeFrom[:12]
	if oldBin == "" {
		root, _ := filepath.Abs("..")
		oldVersion = "v0.0.0-upgrade-test"
		oldBin = buildConsumer(t, root, filepath.Join(dir, "consumer-x"),
			"-ldflags", "-X github.com/flowlog/flowlog/internal/buildinfo.version="+oldVersion)
		t.Logf("no %s in this clone (%s): the old replicas are this tree stamped %s", upgradeFrom[:12], why, oldVersion)
	}
	t.Logf("upgrading from %s to this tree", oldVersion)

	c := startCluster(t, 4)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "up", "--tables", "1,2")
	start := time.Date(2026, 3, 5, 8, 0, 0, 0, time.UTC)
	var loads []loadgen.Config
	load := func(seed int64) {
		cfg := loadgen.Config{Events: 4000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 200, Seed: seed, StartTime: start}
		start = restoreTSTime(expectLoad(cfg).maxResolved).Add(time.Second)
		runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
		loads = append(loads, cfg)
	}
	// The new replicas keep writing layout v1 (docs/UPGRADING.md, "A
	// rolling upgrade"): the old build, which reads v1 only, must still
	// restore the backup after a rollback.
	replica := func(name, bin string) *proc {
		args := c.consumerArgs(t, name)
		if bin == newBin {
			args = append(args, "--layout", "v1")
		}
		return startConsumerBin(t, name, bin, args...)
	}
	holding := func(ps ...*proc) {
		t.Helper()
		waitFor(t, 90*time.Second, func() (bool, string) {
			for _, p := range ps {
				st, err := rebalanceGetStatus(p)
				if err != nil || len(st.Partitions) == 0 {
					return false, fmt.Sprintf("%s holds no partition yet (%v)", p.name, err)
				}
			}
			return true, ""
		})
	}

	old1, old2 := replica("old-1", oldBin), replica("old-2", oldBin)
	holding(old1, old2)
	load(2401)
	if err := old1.Stop(); err != nil {
		t.Fatalf("old-1 exit after SIGTERM: %v", err)
	}
	new1 := replica("new-1", newBin)
	holding(old2, new1)
	load(2402)
	if info := buildInfo(t, new1); !strings.Contains(info, `revision="`) || strings.Contains(info, oldVersion) {
		t.Errorf("new-1's build info %q does not name this build", info)
	}
	if info := buildInfo(t, old2); info != "" && !strings.Contains(info, oldVersion) {
		t.Errorf("old-2's build info %q does not name the old build %s", info, oldVersion)
	}
	if err := old2.Stop(); err != nil {
		t.Fatalf("old-2 exit after SIGTERM: %v", err)
	}
	new2 := replica("new-2", newBin)
	holding(new1, new2)
	load(2403)

	rep := oracleCheck(t, c, "up", []int64{1, 2}, loads...)
	t.Logf("after the upgrade: %s", rep)

	// A rollback: the old build restores what the mixed and the new group
	// wrote, as of the same checkpoint, row for row.
	outNew, outOld := t.TempDir(), t.TempDir()
	ts := strconv.FormatUint(rep.checkpoint, 10)
	args := append(restoreConnArgs(c), "--flow", "up", "--ts", ts, "--temp-dir", t.TempDir())
	for bin, out := range map[string]string{newBin: outNew, oldBin: outOld} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		b, err := exec.CommandContext(ctx, bin, append(append([]string{"restore"}, args...), "--out", out)...).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%s restore: %v\n%s", filepath.Base(bin), err, b)
		}
	}
	for _, table := range []string{"1.jsonl", "2.jsonl"} {
		a, errA := os.ReadFile(filepath.Join(outNew, table))
		b, errB := os.ReadFile(filepath.Join(outOld, table))
		if errA != nil || errB != nil || !bytes.Equal(a, b) || len(a) == 0 {
			t.Errorf("%s: the old build's restore differs from the new one's (%d and %d bytes, %v, %v)", table, len(b), len(a), errB, errA)
		}
	}
	for _, p := range []*proc{new1, new2} {
		if err := p.Stop(); err != nil {
			t.Errorf("%s exit after SIGTERM: %v", p.name, err)
		}
	}
}
