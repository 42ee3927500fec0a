//go:build !linux

package testenv

import "syscall"

// childAttr puts a service process in its own process group. Outside Linux
// there is no parent-death signal: only the test's cleanup stops it.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// signalGroup sends sig to the process group of pid.
func signalGroup(pid int, sig syscall.Signal) { _ = syscall.Kill(-pid, sig) }
