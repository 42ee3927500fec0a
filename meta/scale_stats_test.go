package meta_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// redisSample is what INFO says of the server's work so far.
type redisSample struct {
	cpu     float64            // used_cpu_user + used_cpu_sys, seconds
	calls   map[string]int64   // commandstats calls, by command
	usec    map[string]int64   // commandstats usec, by command
	in, out int64              // total_net_input_bytes, total_net_output_bytes
	machine float64            // busy CPU seconds of the whole machine (/proc/stat)
	self    float64            // this process's CPU seconds (getrusage)
	retries map[string]float64 // flowlog_redis_txn_retries_total by op
	sampled time.Time
}

// sampleRedis reads the server's counters and the replicas' retries.
func sampleRedis(ctx context.Context, rdb *redis.Client, reg prometheus.Gatherer) (redisSample, error) {
	s := redisSample{calls: map[string]int64{}, usec: map[string]int64{}, retries: map[string]float64{}, sampled: time.Now()}
	raw, err := rdb.Info(ctx, "cpu", "commandstats", "stats", "memory").Result()
	if err != nil {
		return s, fmt.Errorf("info: %w", err)
	}
	for _, line := range strings.Split(raw, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			s.cpu += f
		case k == "total_net_input_bytes":
			s.in, _ = strconv.ParseInt(v, 10, 64)
		case k == "total_net_output_bytes":
			s.out, _ = strconv.ParseInt(v, 10, 64)
		case strings.HasPrefix(k, "cmdstat_"):
			name := strings.TrimPrefix(k, "cmdstat_")
			for _, f := range strings.Split(v, ",") {
				fk, fv, _ := strings.Cut(f, "=")
				switch fk {
				case "calls":
					s.calls[name], _ = strconv.ParseInt(fv, 10, 64)
				case "usec":
					s.usec[name], _ = strconv.ParseInt(fv, 10, 64)
				}
			}
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		return s, fmt.Errorf("gather: %w", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flowlog_redis_txn_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" {
					s.retries[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	s.machine = machineBusy()
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	return s, nil
}

// machineBusy is the CPU seconds every core spent neither idle nor in
// iowait since boot (/proc/stat; USER_HZ is 100 on Linux), or 0 where it
// cannot tell.
func machineBusy() float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy / 100
}

// simResult is one measured point.
type simResult struct {
	shape              simShape
	window             time.Duration
	commits            int
	commitP50, p99     time.Duration
	advP50, advP99     time.Duration
	cycleP99           time.Duration
	retries            map[string]float64
	redisCores         float64
	machineCores       float64
	selfCores          float64
	cmdsPerCommit      float64
	inPerCommit        float64
	outPerCommit       float64
	topCmds            string
	topTime            string // the commands that took the most Redis time, µs per commit
	errs               []error
	finErrs            int64 // failed coverage finalisations, the whole run
	finErr             error // the last of them
	flowsMovedPerCycle float64
}

func (r simResult) offered() float64 {
	return float64(r.shape.Replicas) / r.shape.Interval.Seconds()
}

func (r simResult) achieved() float64 { return float64(r.commits) / r.window.Seconds() }

func newSimResult(shape simShape, st *simStats, a, b redisSample) simResult {
	st.mu.Lock()
	defer st.mu.Unlock()
	r := simResult{shape: shape, window: b.sampled.Sub(a.sampled), commits: st.commits, errs: st.errs,
		commitP50: quantile(st.commit, 0.5), p99: quantile(st.commit, 0.99),
		advP50: quantile(st.advance, 0.5), advP99: quantile(st.advance, 0.99), cycleP99: quantile(st.cycle, 0.99)}
	secs := r.window.Seconds()
	r.redisCores = (b.cpu - a.cpu) / secs
	r.machineCores = (b.machine - a.machine) / secs
	r.selfCores = (b.self - a.self) / secs
	n := float64(max(st.commits, 1))
	r.flowsMovedPerCycle = float64(st.advanced) / n
	type kv struct {
		k string
		v int64
	}
	var cmds []kv
	var total int64
	for k, v := range b.calls {
		d := v - a.calls[k]
		if d > 0 && k != "info" {
			cmds = append(cmds, kv{k, d})
			total += d
		}
	}
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].v > cmds[j].v })
	var top []string
	for _, c := range cmds[:min(len(cmds), 6)] {
		top = append(top, fmt.Sprintf("%s %.0f", c.k, float64(c.v)/n))
	}
	r.topCmds = strings.Join(top, ", ")
	var times []kv
	for k, v := range b.usec {
		if d := v - a.usec[k]; d > 0 && k != "info" {
			times = append(times, kv{k, d})
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i].v > times[j].v })
	top = top[:0]
	for _, c := range times[:min(len(times), 6)] {
		top = append(top, fmt.Sprintf("%s %.0f", c.k, float64(c.v)/n))
	}
	r.topTime = strings.Join(top, ", ")
	r.cmdsPerCommit = float64(total) / n
	r.inPerCommit = float64(b.in-a.in) / n
	r.outPerCommit = float64(b.out-a.out) / n
	r.retries = map[string]float64{}
	for op, v := range b.retries {
		if d := v - a.retries[op]; d > 0 {
			r.retries[op] = d
		}
	}
	return r
}

// simHeader and row are one run of a point, the rows that the table of
// docs/SIZING.md, "Replicas and Redis", gives as ranges over runs.
const simHeader = "| replicas | flows | offered/s | commits/s | commit p50 | commit p99 | advance p50 | advance p99 | WATCH retries/commit | Redis CPU | Redis CPU/commit | machine CPU | cmds/commit | bytes in/out per commit |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

func (r simResult) row() string {
	var retries float64
	for _, v := range r.retries {
		retries += v
	}
	perCommit := time.Duration(r.redisCores / max(r.achieved(), 1e-9) * float64(time.Second))
	return fmt.Sprintf("| %d | %d | %.0f | %.1f | %s | %s | %s | %s | %.2f | %.2f | %s | %.2f | %.0f | %.0f / %.0f |",
		r.shape.Replicas, r.shape.Flows, r.offered(), r.achieved(), ms(r.commitP50), ms(r.p99), ms(r.advP50), ms(r.advP99),
		retries/float64(max(r.commits, 1)), r.redisCores, ms(perCommit), r.machineCores, r.cmdsPerCommit, r.inPerCommit, r.outPerCommit)
}

func ms(d time.Duration) string {
	if d >= 100*time.Millisecond {
		return fmt.Sprintf("%.0f ms", d.Seconds()*1000)
	}
	return fmt.Sprintf("%.1f ms", d.Seconds()*1000)
}
