// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

//go:build !linux

package envoy

import "os/exec"

// setDeathSignal does nothing where the OS has no parent-death signal.
func setDeathSignal(*exec.Cmd) {}
