package testenv

import "syscall"

// childAttr puts a service process in its own process group (so a kill
// reaches anything it forks) and has the kernel SIGKILL it when the test
// binary dies, whatever the way: a panic, a test timeout, a SIGKILL.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup sends sig to the process group of pid.
func signalGroup(pid int, sig syscall.Signal) { _ = syscall.Kill(-pid, sig) }
