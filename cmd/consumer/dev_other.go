//go:build !nodev && !unix

package main

import "os/exec"

// ownProcessGroup does nothing where process groups do not exist.
func ownProcessGroup(*exec.Cmd) {}
