package envoyratelimit

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the child die with SIGKILL when the process that
// started it exits, so a crashed test leaves no server behind.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
