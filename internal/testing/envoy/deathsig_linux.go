// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoy

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes Envoy die with SIGKILL when the process that started
// it exits, so a crashed test or benchmark leaves no Envoy behind.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
