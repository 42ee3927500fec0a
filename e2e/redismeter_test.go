package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
)

// redisMeter is a TCP proxy in front of a redis-server that counts what
// its clients send and receive: the commands (RESP arrays), the bytes in
// (client to server) and the bytes out. A benchmark points one process at
// it to measure that process's Redis work alone, however many other
// clients (its own polling, `consumer flows`) use the same server. It
// counts commands as sent, so a transaction that EXEC aborts counts as
// the server's totals do not.
type redisMeter struct {
	ln     net.Listener
	target string
	URL    string // redis://host:port/0 of the proxy

	cmds, in, out atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	names map[string]int64 // commands by name
	wg    sync.WaitGroup
}

// startRedisMeter listens on a free loopback port and forwards every
// connection to target (host:port). It stops when the test ends.
func startRedisMeter(t testing.TB, target string) *redisMeter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redis meter: %v", err)
	}
	m := &redisMeter{ln: ln, target: target, URL: "redis://" + ln.Addr().String() + "/0"}
	m.wg.Add(1)
	go m.accept()
	t.Cleanup(m.close)
	return m
}

// totals returns the counts so far.
func (m *redisMeter) totals() redisTotals {
	return redisTotals{cmds: m.cmds.Load(), inBytes: m.in.Load(), outBytes: m.out.Load()}
}

func (m *redisMeter) accept() {
	defer m.wg.Done()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", m.target)
		if err != nil {
			c.Close()
			continue
		}
		m.mu.Lock()
		m.conns = append(m.conns, c, s)
		m.mu.Unlock()
		m.wg.Add(2)
		go func() {
			defer m.wg.Done()
			_ = m.requests(s, c)
			s.Close()
		}()
		go func() {
			defer m.wg.Done()
			_, _ = io.Copy(c, countingReader{s, &m.out})
			c.Close()
		}()
	}
}

func (m *redisMeter) close() {
	m.ln.Close()
	m.mu.Lock()
	for _, c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// tally counts a command by its name, the size bytes next in br.
func (m *redisMeter) tally(br *bufio.Reader, size int64) {
	name := "?"
	if size <= 32 {
		if b, err := br.Peek(int(size)); err == nil {
			name = strings.ToLower(string(b))
		}
	}
	m.mu.Lock()
	if m.names == nil {
		m.names = map[string]int64{}
	}
	m.names[name]++
	m.mu.Unlock()
}

// byName returns the commands counted so far by name.
func (m *redisMeter) byName() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.names)
}

// countingReader adds what it reads to n as it reads it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// requests copies a client's requests to the server, counting each
// command (a RESP array of bulk strings, which is all go-redis sends) and
// every byte. It flushes whenever the client has nothing more buffered,
// so that a command never waits in the proxy for the next one.
func (m *redisMeter) requests(dst io.Writer, src io.Reader) error {
	br := bufio.NewReaderSize(src, 64<<10)
	bw := bufio.NewWriterSize(dst, 64<<10)
	line := func() ([]byte, error) {
		l, err := br.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		m.in.Add(int64(len(l)))
		if _, err := bw.Write(l); err != nil {
			return nil, err
		}
		return l, nil
	}
	count := func(l []byte) (int64, error) {
		if len(l) < 3 {
			return 0, fmt.Errorf("redis meter: short RESP header %q", l)
		}
		return strconv.ParseInt(string(l[1:len(l)-2]), 10, 64)
	}
	for {
		l, err := line()
		if err != nil {
			return err
		}
		if l[0] != '*' {
			return errors.New("redis meter: not a RESP array (an inline command)")
		}
		n, err := count(l)
		if err != nil {
			return err
		}
		m.cmds.Add(1)
		for i := range n {
			h, err := line()
			if err != nil {
				return err
			}
			if h[0] != '$' {
				return fmt.Errorf("redis meter: argument is not a bulk string: %q", h)
			}
			size, err := count(h)
			if err != nil {
				return err
			}
			if size < 0 {
				continue
			}
			if i == 0 {
				m.tally(br, size)
			}
			c, err := io.CopyN(bw, br, size+2)
			m.in.Add(c)
			if err != nil {
				return err
			}
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
	}
}

// TestRedisMeter checks the meter's counts against what the server itself
// counted for the same requests: commands sent one after another without
// waiting, a transaction, and an argument larger than the proxy's buffer.
// The requests are written by hand: a client library's connection
// handshake sends commands Redis 7.0 rejects and does not count.
func TestRedisMeter(t *testing.T) {
	rs := testenv.StartRedis(t)
	m := startRedisMeter(t, rs.Addr)
	direct := rs.Client(t)
	ctx := context.Background()
	calls := func() int64 {
		s, err := direct.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for l := range strings.Lines(s) {
			name, v, ok := strings.Cut(strings.TrimSpace(l), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
				continue
			}
			for f := range strings.SplitSeq(v, ",") {
				if c, ok := strings.CutPrefix(f, "calls="); ok {
					k, _ := strconv.ParseInt(c, 10, 64)
					n += k
				}
			}
		}
		return n
	}
	resp := func(args ...string) string {
		s := fmt.Sprintf("*%d\r\n", len(args))
		for _, a := range args {
			s += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
		}
		return s
	}
	big := strings.Repeat("v", 200<<10)
	req := resp("SET", "k", big) + resp("GET", "k")
	for i := range 10 {
		req += resp("INCR", fmt.Sprintf("n%d", i))
	}
	req += resp("MULTI") + resp("HSET", "h", "a", "1", "b", "") + resp("DEL", "n0") + resp("EXEC") + resp("PING")

	serverBefore := calls()
	conn, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(m.URL, "redis://"), "/0"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	var reply []byte
	buf := make([]byte, 64<<10)
	for !strings.HasSuffix(string(reply), "+PONG\r\n") {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("read the replies: %v (after %d bytes)", err, len(reply))
		}
		reply = append(reply, buf[:n]...)
	}
	got := m.totals()
	if n := m.byName(); n["incr"] != 10 || n["set"] != 1 || n["exec"] != 1 {
		t.Errorf("meter counted by name %v, want 10 incr, 1 set, 1 exec", n)
	}
	if want := calls() - serverBefore; got.cmds != want || want != 17 {
		t.Errorf("meter counted %d commands, the server %d (want 17)", got.cmds, want)
	}
	if got.inBytes != int64(len(req)) || got.outBytes != int64(len(reply)) {
		t.Errorf("meter counted %d bytes in and %d out, want %d and %d", got.inBytes, got.outBytes, len(req), len(reply))
	}
}
