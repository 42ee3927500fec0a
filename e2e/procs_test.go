package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one process of a test: a built binary with its arguments, its
// stdout and stderr appended to a log file in the test's temp dir. It is
// killed when the test ends, and its log is printed if the test failed.
type proc struct {
	t       testing.TB
	name    string
	bin     string
	args    []string
	env     []string
	logPath string
	ready   func(p *proc, logFrom int64) error // waits until the process serves

	// Addr is the host:port the process announced, if it announces one.
	Addr   string
	pinned bool // --port of Addr appended to args, so a restart keeps the address

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	err  error         // cmd.Wait's result, valid after done
}

// newProc returns an unstarted process whose log goes to
// t.TempDir()/<name>.log.
func newProc(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, bin: bin, args: args, logPath: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- log of %s (%s):\n%s", p.name, p.logPath, p.logTail(64<<10))
		}
	})
	return p
}

// Start starts the process and waits until it is ready, failing the test
// otherwise.
func (p *proc) Start() {
	p.t.Helper()
	if err := p.start(); err != nil {
		p.t.Fatalf("start %s: %v", p.name, err)
	}
}

func (p *proc) start() error {
	p.mu.Lock()
	if p.cmd != nil && !p.exited() {
		p.mu.Unlock()
		return errors.New("already running")
	}
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	defer log.Close()
	from, _ := log.Seek(0, io.SeekEnd)
	fmt.Fprintf(log, "=== %s: start %s %s\n", time.Now().Format(time.RFC3339Nano), p.name, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		return err
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	if p.ready != nil {
		if err := p.ready(p, from); err != nil {
			p.Kill()
			return err
		}
	}
	return nil
}

// exited reports whether the current process has been waited for; p.mu held.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// hasExited is exited for callers that do not hold p.mu.
func (p *proc) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited()
}

// Running reports whether the process is running.
func (p *proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !p.exited()
}

// Signal sends sig to the process, if it is running.
func (p *proc) Signal(sig os.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// Wait waits for the process to exit and returns its exit error (nil for
// exit status 0).
func (p *proc) Wait() error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return errors.New("never started")
	}
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Kill sends SIGKILL (continuing a stopped process) and waits for the exit.
func (p *proc) Kill() {
	p.Signal(syscall.SIGKILL)
	p.Signal(syscall.SIGCONT)
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Stop sends SIGTERM and waits for the exit, killing the process after 30
// seconds; it returns the exit error.
func (p *proc) Stop() error {
	p.Signal(syscall.SIGTERM)
	t := time.AfterFunc(30*time.Second, func() {
		p.t.Errorf("%s did not exit 30s after SIGTERM; killing it", p.name)
		p.Kill()
	})
	defer t.Stop()
	return p.Wait()
}

// Restart kills the process if it is still running and starts it again
// with the same arguments (a process that announced a port gets it again).
func (p *proc) Restart() {
	p.t.Helper()
	p.Kill()
	p.Start()
}

// Log returns the whole log of the process.
func (p *proc) Log() string { return readFile(p.logPath) }

// logSize is the length of the log so far (0 before the first start).
func (p *proc) logSize() int64 {
	fi, err := os.Stat(p.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logFrom is the log from offset from on.
func (p *proc) logFrom(from int64) string {
	b, _ := os.ReadFile(p.logPath)
	if int64(len(b)) <= from {
		return ""
	}
	return string(b[from:])
}

// readFile is the file's content, empty if it cannot be read.
func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func (p *proc) logTail(n int64) string {
	b, _ := os.ReadFile(p.logPath)
	if int64(len(b)) > n {
		b = append([]byte("...\n"), b[int64(len(b))-n:]...)
	}
	return string(b)
}

// waitForLine is a ready func: it waits for a log line after from that
// starts with prefix, takes the rest of it as the process's address, and
// pins the port for restarts.
func waitForLine(prefix string) func(p *proc, from int64) error {
	return func(p *proc, from int64) error {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			b, _ := os.ReadFile(p.logPath)
			if int64(len(b)) > from {
				for _, line := range strings.Split(string(b[from:]), "\n") {
					if addr, ok := strings.CutPrefix(line, prefix); ok && strings.Contains(line[len(prefix):], ":") {
						if _, port, err := net.SplitHostPort(strings.TrimSpace(addr)); err == nil {
							p.Addr = strings.TrimSpace(addr)
							if !p.pinned {
								p.args, p.pinned = append(p.args, "--port", port), true
							}
							return nil
						}
					}
				}
			}
			if p.hasExited() {
				return fmt.Errorf("exited before announcing %q: %v", prefix, p.Wait())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return fmt.Errorf("no %q line within 30s", prefix)
	}
}

// waitForHTTP is a ready func: it waits until GET http://<addr><path>
// answers 200.
func waitForHTTP(addr, path string) func(p *proc, from int64) error {
	return func(p *proc, _ int64) error {
		cl := &http.Client{Timeout: time.Second}
		var last string
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			resp, err := cl.Get("http://" + addr + path)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					p.Addr = addr
					return nil
				}
				last = resp.Status
			} else {
				last = err.Error()
			}
			if p.hasExited() {
				return fmt.Errorf("exited before %s answered: %v", path, p.Wait())
			}
			time.Sleep(50 * time.Millisecond)
		}
		return fmt.Errorf("%s not ready within 60s: %s", path, last)
	}
}
