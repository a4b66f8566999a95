//go:build !linux

package envoyratelimit

import "os/exec"

// setDeathSignal does nothing where the OS has no parent-death signal.
func setDeathSignal(*exec.Cmd) {}
