package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// ExitInterrupted is the exit code of a command stopped by an interrupt,
// as a shell reports a process ended by SIGINT (128 + 2).
const ExitInterrupted = 130

// ErrInterrupted is the cause of a context that Interrupt canceled.
var ErrInterrupted = errors.New("interrupted")

// Interrupt returns a context that the first SIGINT or SIGTERM cancels with
// cause ErrInterrupted, after calling first with the signal: the command
// then stops its work and cleans up. A second signal calls second and exits
// the process at once with ExitInterrupted, cleaning up nothing more. stop
// releases the signals; it does not cancel a context that is not done.
func Interrupt(parent context.Context, first func(os.Signal), second func()) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 2)
	done := make(chan struct{})
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-ch:
			if first != nil {
				first(sig)
			}
			cancel(ErrInterrupted)
		case <-done:
			return
		}
		select {
		case <-ch:
			if second != nil {
				second()
			}
			os.Exit(ExitInterrupted)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel(context.Canceled)
	}
}

// Interrupted reports whether ctx was canceled by Interrupt's signal.
func Interrupted(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), ErrInterrupted)
}

// InterruptedError is a command's account of work an interrupt stopped:
// what was interrupted and what it left behind or cleaned up. The command's
// main prints it after "interrupted: " and exits with ExitInterrupted.
type InterruptedError struct{ Msg string }

func (e *InterruptedError) Error() string { return e.Msg }

// Interruptedf returns an *InterruptedError with a formatted message.
func Interruptedf(format string, args ...any) error {
	return &InterruptedError{Msg: fmt.Sprintf(format, args...)}
}
