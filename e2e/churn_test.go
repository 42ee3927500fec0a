package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// churnSeed is TestChurn's seed: the load, the DDL script, the faults and
// the restore points all follow from it.
var churnSeed = flag.Int("churn-seed", 0, "seed of TestChurn's load, DDL script, faults and restore points (0: the fixed CI seed)")

const churnDefaultSeed = 4242

// Shape of the churn run.
const (
	churnPartitions  = 8
	churnSteps       = 44               // DDL records in the script
	churnLoadSeconds = 30.0             // how long the load runs
	churnDDLSpan     = 26 * time.Second // the script's DDL after the first two spread over this
	churnProxyOutage = time.Second
	churnProxyFaults = 3 // DDL after which churn-1's next registry refresh meets a Redis outage
)

// TestChurn checks flows that change all the time while data flows and things
// break. Three consumers in one group on 8 apply partitions back up a steady
// load over tables 1-6 while a seeded script of 44 flow DDL (create, create
// --if-not-exists, replace adding and removing tables, drop, re-create of a
// dropped name, resume, and DDL that must be rejected) is published;
// meanwhile a random consumer is SIGKILLed and restarted every few seconds,
// redis-server is killed and restarted twice, and one consumer's Redis
// connections (through a proxy) are cut right when it refreshes its registry
// after a DDL. Afterwards, for every flow id ever created, live or dropped:
// the coverage windows match the script, every produced event inside a window
// is backed up exactly once, and restores at the checkpoint and two earlier
// ts equal the MVCC read inside the windows that hold the ts, leaving out
// every other table. No consumer exits on its own, every live flow's
// checkpoint reaches the end of the load, every DDL is applied once
// (ddl:offset is the DDL topic's end) and the DLQ holds exactly the DDL the
// script expects to be rejected.
func TestChurn(t *testing.T) {
	began := time.Now()
	seed := int64(churnDefaultSeed)
	if *churnSeed != 0 {
		seed = int64(*churnSeed)
	}
	t.Logf("churn seed %d (-churn-seed to change)", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0xc0ffee))

	rp, rds := faultStartRedis(t)
	c := &cluster{Broker: startBroker(t, churnPartitions), GCS: startGCS(t), Redis: rds}
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	proxy := startRedisProxy(t, rds.Addr, store.Keys().Flows(), churnProxyOutage)

	cfg := loadgen.Config{
		Events: 30_000, Tables: churnTables, Regions: 16, ValueSize: 64, Seed: seed, HeartbeatEvery: 4,
		StartTime: time.Date(2026, 5, 4, 9, 59, 50, 0, time.UTC),
	}
	st := expectLoad(cfg)
	script, model := churnScript(rng, churnSteps)
	for _, d := range script {
		t.Log(d)
	}

	// Two flows exist before anything else.
	producer := binary(t, "producer")
	for _, d := range script[:2] {
		if err := churnPublish(producer, c.Broker.Addr, d); err != nil {
			t.Fatal(err)
		}
	}
	// Every region announces itself before its data, as TiKV's CDC does
	// with each region's initial resolved ts: a partition's checkpoint,
	// and so a window's until, only counts regions it has heard from, and
	// loadgen's regions are otherwise silent until their first batch,
	// while the others' resolved ts move past their first commits.
	runProducer(t, "heartbeat", "--brokers", c.Broker.Addr, "--regions", strconv.Itoa(cfg.Regions),
		"--start-time", cfg.StartTime.Format(time.RFC3339Nano))
	args := []string{"--session-timeout", crashSessionTimeout, "--flush-interval", "1s", "--flush-size", "1MiB",
		"--retry-backoff", "50ms", "--max-retry-delay", "1s"}
	cons := []*proc{c.startConsumer(t, "churn-1", append(slices.Clone(args), "--redis-url", proxy.URL())...)}
	for i := 2; i <= 3; i++ {
		cons = append(cons, c.startConsumer(t, fmt.Sprintf("churn-%d", i), args...))
	}
	for _, p := range cons {
		crashWaitAssigned(t, p, 0, 30*time.Second)
	}
	load := crashLoadAsync(t, c, cfg, float64(st.events)/churnLoadSeconds)

	// The script and the faults run side by side until the load is done;
	// both stop before the test returns, however it returns.
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	var wg sync.WaitGroup
	defer wg.Wait()
	defer halt()
	sc := &churnScriptRun{bin: producer, brokers: c.Broker.Addr, script: script, proxy: proxy,
		rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), armAt: map[int]bool{}, done: make(chan struct{})}
	for len(sc.armAt) < churnProxyFaults {
		sc.armAt[2+rng.IntN(len(script)-4)] = true
	}
	ch := &churnFaults{t: t, rp: rp, proxy: proxy, cons: cons, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))}
	wg.Go(func() { sc.run(stop) })
	wg.Go(func() { ch.run(stop, load) })
	load.Wait(t)
	<-sc.done // the script ends by itself, about when the load does
	halt()
	wg.Wait()
	if sc.err != nil {
		t.Fatal(sc.err)
	}
	if ch.err != nil {
		t.Fatal(ch.err)
	}
	if ch.redisRestarts != 2 || ch.kills < 3 {
		t.Errorf("%d Redis restarts and %d SIGKILLs during the load, want 2 and at least 3", ch.redisRestarts, ch.kills)
	}
	t.Logf("load of %d events in %d records done after %v: %d SIGKILLs, %d Redis restarts, %d of %d armed refresh faults injected",
		st.events, st.records, time.Since(began).Round(time.Millisecond), ch.kills, ch.redisRestarts, proxy.injected.Load(), sc.armed)

	// Everything settles: every DDL handled, every window final, every
	// live flow's checkpoint at the end of the load.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	settled := time.Now()
	waitForOrStop(t, 60*time.Second, func() (bool, string, error) {
		for _, p := range cons {
			if !p.Running() {
				return false, "", fmt.Errorf("%s exited: %v", p.name, p.Wait())
			}
		}
		off, _, err := store.DDLOffset(ctx, testenv.DDLTopic, 0)
		if err != nil {
			return false, err.Error(), nil
		}
		if off != int64(len(script)) {
			return false, fmt.Sprintf("ddl:offset %d, %d DDL published", off, len(script)), nil
		}
		pending, err := store.PendingCoverage(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		if len(pending) > 0 {
			return false, fmt.Sprintf("flow %d has %d pending coverage entries", pending[0].ID, len(pending[0].Entries)), nil
		}
		for _, f := range model.flows {
			if !f.live() {
				continue
			}
			fs, err := store.FlowState(ctx, meta.FlowID(f.id))
			if err != nil {
				return false, err.Error(), nil
			}
			if fs.Status == meta.StatusFatal {
				return false, "", fmt.Errorf("flow %d is fatal: %s", f.id, fs.Error)
			}
			if fs.CheckpointTS < st.maxResolved {
				return false, fmt.Sprintf("flow %d (%s) checkpoint %d, the load ends at %d", f.id, f.name, fs.CheckpointTS, st.maxResolved), nil
			}
		}
		return true, "", nil
	})
	t.Logf("settled %v after the load", time.Since(settled).Round(time.Millisecond))

	// The applied DDL: one flow id per create, the rejected ones in the DLQ.
	churnCheckDDL(ctx, t, c, store, script, model, cons)
	if proxy.injected.Load() == 0 {
		t.Errorf("no Redis fault hit churn-1's registry refresh after a DDL (%d armed)", sc.armed)
	}
	if n := strings.Count(cons[0].Log(), "refresh registry"); n == 0 {
		t.Errorf("churn-1 logged no failed registry refresh although %d outages were injected", proxy.injected.Load())
	}

	// Every flow id, live or dropped.
	o := &churnOracle{t: t, c: c, store: store, bucket: newCachedBucket(ctx, t, c), data: newChurnData(cfg),
		rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))}
	oracleStart := time.Now()
	for _, f := range model.flows {
		rep := o.checkFlow(ctx, f)
		t.Logf("%s (%s, steps %d-%d): %s", f.name, map[bool]string{true: "live", false: "dropped"}[f.live()], f.created, f.dropped, rep)
	}
	t.Logf("oracle over %d flow ids took %v", len(model.flows), time.Since(oracleStart).Round(time.Millisecond))

	for _, p := range cons {
		if !p.Running() {
			t.Errorf("%s exited on its own: %v", p.name, p.Wait())
		} else if err := p.Stop(); err != nil {
			t.Errorf("%s exit after SIGTERM: %v", p.name, err)
		}
	}
	t.Logf("churn took %v", time.Since(began).Round(time.Millisecond))
}

// churnFaults SIGKILLs and restarts a random consumer every few seconds and
// kills and restarts redis-server twice, one fault at a time, so that no
// consumer starts while Redis is down (a consumer that cannot reach Redis
// at start exits, as documented).
type churnFaults struct {
	t     *testing.T
	rp    *proc
	proxy *redisProxy
	cons  []*proc
	rng   *rand.Rand

	kills, redisRestarts int
	err                  error // a consumer that exited on its own, or a restart that failed
}

func (f *churnFaults) run(stop <-chan struct{}, load *crashLoad) {
	start := time.Now()
	redisAt := []time.Duration{time.Duration(0.3 * churnLoadSeconds * float64(time.Second)),
		time.Duration(0.6 * churnLoadSeconds * float64(time.Second))}
	for {
		select {
		case <-stop:
			return
		case <-time.After(3*time.Second + time.Duration(f.rng.Int64N(int64(2*time.Second)))):
		}
		if load.Done() {
			return
		}
		for _, p := range f.cons {
			if !p.Running() {
				f.err = fmt.Errorf("%s exited on its own: %v", p.name, p.Wait())
				return
			}
		}
		if len(redisAt) > 0 && time.Since(start) >= redisAt[0] {
			redisAt = redisAt[1:]
			f.rp.Kill()
			f.t.Logf("%v: redis-server killed", time.Since(start).Round(time.Millisecond))
			time.Sleep(2 * time.Second)
			if err := f.rp.start(); err != nil {
				f.err = fmt.Errorf("restart redis-server: %w", err)
				return
			}
			f.redisRestarts++
			continue
		}
		i := f.rng.IntN(len(f.cons))
		victim := f.cons[i]
		if i == 0 {
			f.proxy.block()
		}
		victim.Kill()
		f.kills++
		err := victim.start()
		if i == 0 {
			f.proxy.unblock()
		}
		f.t.Logf("%v: SIGKILL and restart of %s", time.Since(start).Round(time.Millisecond), victim.name)
		if err != nil {
			f.err = fmt.Errorf("restart %s: %w", victim.name, err)
			return
		}
	}
}

// churnScriptRun publishes the script's DDL after the first two, spread
// over churnDDLSpan, and arms the proxy after the DDL of armAt.
type churnScriptRun struct {
	bin, brokers string
	script       []*churnDDL
	proxy        *redisProxy
	rng          *rand.Rand
	armAt        map[int]bool // steps

	done  chan struct{} // closed when run returns
	armed int           // arms that took (churn-1 was not restarting)
	err   error         // a DDL that could not be published
}

func (r *churnScriptRun) run(stop <-chan struct{}) {
	defer close(r.done)
	pause := churnDDLSpan / time.Duration(len(r.script)-2)
	for _, d := range r.script[2:] {
		select {
		case <-stop:
			return
		case <-time.After(pause/2 + time.Duration(r.rng.Int64N(int64(pause)))):
		}
		if err := churnPublish(r.bin, r.brokers, d); err != nil {
			r.err = err
			return
		}
		if r.armAt[d.step] && r.proxy.arm() {
			r.armed++
		}
	}
}

var churnPublished = regexp.MustCompile(`published \w+ \S+ at partition (\d+) offset (\d+)`)

// churnPublish publishes d with `producer flow` and records its offset.
func churnPublish(bin, brokers string, d *churnDDL) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(d.args(), "--brokers", brokers)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", d, err, out)
	}
	m := churnPublished.FindStringSubmatch(string(out))
	if m == nil || m[1] != "0" {
		return fmt.Errorf("%s: producer printed %q", d, out)
	}
	d.offset, _ = strconv.ParseInt(m[2], 10, 64)
	if d.offset != int64(d.step) {
		return fmt.Errorf("%s: published at offset %d, want %d (the script is the DDL topic's only writer)", d, d.offset, d.step)
	}
	return nil
}

// churnCheckDDL checks that the DDL topic ends at the script's length and
// ddl:offset there, that flow:seq counted one id per create, and that the
// DLQ holds exactly the rejected DDL, each once: racing replicas claim it
// in Redis and only the winner sends it. Only a takeover of the claim of a
// consumer killed between its claim and the DLQ's ack may write it again,
// and no claim is left owed.
func churnCheckDDL(ctx context.Context, t *testing.T, c *cluster, store *meta.Store, script []*churnDDL, model *churnModel, cons []*proc) {
	t.Helper()
	adm := newAdmin(t, c.Broker.Addr)
	defer adm.Close()
	ends, err := adm.ListEndOffsets(ctx, testenv.DDLTopic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("end offsets of %s: %v", testenv.DDLTopic, err)
	}
	if e, _ := ends.Lookup(testenv.DDLTopic, 0); e.Offset != int64(len(script)) {
		t.Errorf("DDL topic ends at %d, the script published %d", e.Offset, len(script))
	}
	seq, err := store.Client().Get(ctx, store.Keys().FlowSeq()).Int()
	if err != nil || seq != len(model.flows) {
		t.Errorf("flow:seq = %d (%v), the script created %d flows", seq, err, len(model.flows))
	}
	want := map[int64]*churnDDL{}
	for _, d := range script {
		if d.reject {
			want[d.offset] = d
		}
	}
	// A consumer killed between its claim and the DLQ's ack leaves the
	// record owed until another takes the claim over (30s after it).
	var owed []meta.RejectedDDL
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		owed, err = store.PendingDDLRejects(ctx, testenv.DDLTopic, 0)
		if err == nil && len(owed) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || len(owed) > 0 {
		t.Errorf("DLQ records still owed 45s after the load (claims left in Redis): %+v, %v", owed, err)
	}
	got := map[int64]int{}
	for _, r := range churnReadTopic(ctx, t, adm, c.Broker.Addr, testenv.DLQTopic) {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		if h[event.HeaderSourceTopic] != testenv.DDLTopic {
			t.Errorf("DLQ record at %d from %s/%s@%s: %s", r.Offset, h[event.HeaderSourceTopic], h[event.HeaderSourcePartition],
				h[event.HeaderSourceOffset], h[event.HeaderError])
			continue
		}
		off, _ := strconv.ParseInt(h[event.HeaderSourceOffset], 10, 64)
		got[off]++
		if d := want[off]; d == nil {
			t.Errorf("DLQ holds DDL offset %d, which the script expects applied: %s", off, h[event.HeaderError])
		}
	}
	again := 0
	for off, d := range want {
		if got[off] == 0 {
			t.Errorf("DLQ lacks the rejected %s", d)
		}
		if got[off] > 1 {
			again += got[off] - 1
			var by []string
			takeover := false
			for _, p := range cons {
				for _, l := range crashLogLines(p, 0, "flow ddl sent to the DLQ") {
					if o, _ := l["offset"].(float64); int64(o) == off {
						by = append(by, p.name+" at "+fmt.Sprint(l["time"]))
					}
				}
				for _, l := range crashLogLines(p, 0, "sending a rejected flow ddl to the DLQ for an instance that claimed it and did not finish") {
					if o, _ := l["offset"].(float64); int64(o) == off {
						takeover = true
					}
				}
			}
			if !takeover {
				t.Errorf("DLQ holds DDL offset %d %d times with no claim taken over; sent by %s", off, got[off], strings.Join(by, ", "))
			} else {
				t.Logf("DLQ holds DDL offset %d %d times after a claim was taken over; sent by %s", off, got[off], strings.Join(by, ", "))
			}
		}
	}

	t.Logf("DDL: %d published, %d flow ids created, %d rejected into the DLQ (%d DLQ records written again)",
		len(script), len(model.flows), len(want), again)
}

// churnReadTopic reads topic from its start to its end offsets.
func churnReadTopic(ctx context.Context, t *testing.T, adm *kadm.Client, brokers, topic string) []*kgo.Record {
	t.Helper()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	if len(left) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	var out []*kgo.Record
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(left) > 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			t.Fatalf("read %s: %v (still to read: %v)", topic, err, left)
		}
		fs.EachError(func(_ string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("fetch %s/%d: %v (retried)", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
	}
	return out
}
