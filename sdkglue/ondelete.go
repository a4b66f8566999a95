// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

//go:build wasip1 && sdkglue && !sdkglue_full

package internal

// streamDoneOnDelete is true: without proxy_on_log, proxy_on_delete tells an
// HTTP context its stream is done (see exportOnDelete).
const streamDoneOnDelete = true
