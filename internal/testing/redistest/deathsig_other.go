//go:build !linux

package redistest

import "os/exec"

// setDeathSignal does nothing where the OS has no parent-death signal.
func setDeathSignal(*exec.Cmd) {}
