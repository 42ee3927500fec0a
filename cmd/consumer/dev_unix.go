//go:build !nodev && unix

package main

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup puts cmd in a process group of its own, out of reach of
// the terminal's Ctrl-C, which goes to the foreground process group.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
