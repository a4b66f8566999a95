// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoytest

import (
	"errors"
	"sort"
)

// Memory checks. A test that bounds Envoy's memory reads what the allocator
// has handed out (Envoy.Memory().Allocated, /memory), or the plugin's own
// gauges, never one resident-memory sample: resident memory moves with
// what the kernel and the allocator do with free pages (one reading on a
// loaded machine was 2 MiB above its neighbours), so a bound on the
// difference of two readings fails on noise. Where only resident memory
// shows the growth (the Wasm VMs' memory is not in Allocated), a test takes
// many readings and bounds their Trend.

// Trend is the growth of ys per unit of xs that the readings show, robust
// to a few wild readings: the median of the slopes between every two
// readings (the Theil–Sen estimator; up to 29% of the readings may be
// anything). It needs at least three readings with distinct xs.
func Trend(xs, ys []float64) (float64, error) {
	if len(xs) != len(ys) {
		return 0, errors.New("envoytest: trend: xs and ys differ in length")
	}
	var slopes []float64
	for i := range xs {
		for j := i + 1; j < len(xs); j++ {
			if dx := xs[j] - xs[i]; dx != 0 {
				slopes = append(slopes, (ys[j]-ys[i])/dx)
			}
		}
	}
	if len(xs) < 3 || len(slopes) == 0 {
		return 0, errors.New("envoytest: trend: fewer than three readings with distinct xs")
	}
	sort.Float64s(slopes)
	n := len(slopes)
	if n%2 == 1 {
		return slopes[n/2], nil
	}
	return (slopes[n/2-1] + slopes[n/2]) / 2, nil
}
