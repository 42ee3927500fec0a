package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// redisProxy is a TCP proxy between one consumer's --redis-url and the
// redis-server. It reads the commands the consumer sends (RESP arrays of
// bulk strings, what every client sends) and can be armed to inject a
// Redis outage at one precise point: the next time the consumer asks for
// the set of all flows (SMEMBERS <prefix>:{flowlog}:flows), which only a
// registry refresh does, the proxy drops that command and every connection
// of the consumer, and refuses new ones for a while. Armed right after a
// DDL is published, that is a Redis error between the DDL's commit and the
// consumer's registry refresh.
type redisProxy struct {
	// Addr is the proxy's host:port.
	Addr string

	target  string
	trigger string // the command (upper case, args joined by spaces) that starts an outage
	outage  time.Duration
	ln      net.Listener

	mu      sync.Mutex
	conns   map[net.Conn]bool
	armed   bool
	blocked bool      // no arming (the consumer is restarting)
	until   time.Time // connections are refused until then

	injected atomic.Int64 // outages started by the trigger
}

// startRedisProxy starts a proxy to target on a free loopback port whose
// armed trigger is "SMEMBERS <flowsKey>"; it stops when the test ends.
func startRedisProxy(t testing.TB, target, flowsKey string, outage time.Duration) *redisProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redis proxy listen: %v", err)
	}
	p := &redisProxy{Addr: ln.Addr().String(), target: target, trigger: "SMEMBERS " + flowsKey, outage: outage,
		ln: ln, conns: map[net.Conn]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.serve()
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		p.dropAll()
	})
	return p
}

// URL is the redis:// URL of the proxy.
func (p *redisProxy) URL() string { return "redis://" + p.Addr + "/0" }

// arm makes the next trigger command start an outage, unless the consumer
// is restarting; it reports whether it armed.
func (p *redisProxy) arm() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blocked {
		p.armed = true
	}
	return p.armed
}

// block disarms the proxy and waits until no outage is in progress, so the
// consumer can be restarted (a consumer that cannot reach Redis at start
// exits); unblock allows arming again.
func (p *redisProxy) block() {
	p.mu.Lock()
	p.blocked, p.armed = true, false
	wait := time.Until(p.until)
	p.mu.Unlock()
	if wait > 0 {
		time.Sleep(wait)
	}
}

func (p *redisProxy) unblock() {
	p.mu.Lock()
	p.blocked = false
	p.mu.Unlock()
}

func (p *redisProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refused := time.Now().Before(p.until)
		if !refused {
			p.conns[c] = true
		}
		p.mu.Unlock()
		if refused {
			_ = c.Close()
			continue
		}
		go p.handle(c)
	}
}

// handle pipes one client connection to a new upstream connection, command
// by command in the client's direction.
func (p *redisProxy) handle(c net.Conn) {
	defer p.drop(c)
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		return // redis-server down: the client sees its connection closed
	}
	p.mu.Lock()
	p.conns[up] = true
	p.mu.Unlock()
	defer p.drop(up)
	go func() {
		_, _ = io.Copy(c, up)
		p.drop(c)
	}()
	r := bufio.NewReader(c)
	for {
		raw, args, err := readCommand(r)
		if err != nil {
			return
		}
		if p.fire(args) {
			return
		}
		if _, err := up.Write(raw); err != nil {
			return
		}
	}
}

// fire starts an outage if the proxy is armed and args is the trigger.
func (p *redisProxy) fire(args []string) bool {
	if len(args) != 2 || strings.ToUpper(args[0])+" "+args[1] != p.trigger {
		return false
	}
	p.mu.Lock()
	if !p.armed {
		p.mu.Unlock()
		return false
	}
	p.armed = false
	p.until = time.Now().Add(p.outage)
	p.mu.Unlock()
	p.injected.Add(1)
	p.dropAll()
	return true
}

func (p *redisProxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *redisProxy) dropAll() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	clear(p.conns)
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// readCommand reads one client command, a RESP array of bulk strings, and
// returns its bytes as read and its arguments.
func readCommand(r *bufio.Reader) (raw []byte, args []string, err error) {
	var buf bytes.Buffer
	line, err := readLine(r, &buf)
	if err != nil {
		return nil, nil, err
	}
	if len(line) == 0 || line[0] != '*' {
		return nil, nil, fmt.Errorf("redis proxy: not a command array: %q", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 || n > 1<<20 {
		return nil, nil, fmt.Errorf("redis proxy: array header %q", line)
	}
	for range n {
		line, err := readLine(r, &buf)
		if err != nil {
			return nil, nil, err
		}
		if len(line) == 0 || line[0] != '$' {
			return nil, nil, fmt.Errorf("redis proxy: not a bulk string: %q", line)
		}
		size, err := strconv.Atoi(line[1:])
		if err != nil || size < 0 || size > 512<<20 {
			return nil, nil, fmt.Errorf("redis proxy: bulk header %q", line)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, nil, err
		}
		buf.Write(b)
		if len(args) < 2 {
			args = append(args, string(b[:size]))
		} else {
			args = append(args, "")
		}
	}
	return buf.Bytes(), args, nil
}

// readLine reads a CRLF-terminated line into buf and returns it without
// the CRLF.
func readLine(r *bufio.Reader, buf *bytes.Buffer) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	buf.WriteString(line)
	return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
}
