// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoytest

import (
	"math"
	"testing"
)

// TestTrend: a level series with one wild reading (the 2 MiB jump of a
// resident-memory sample that failed TestMemoryBound once) has no trend;
// a steady growth is found through noise; too few readings are an error.
func TestTrend(t *testing.T) {
	const mib = 1 << 20
	var xs, level, grow []float64
	for i := 0; i < 20; i++ {
		x := float64(i * 5000)
		noise := float64((i*7)%5-2) * 0.1 * mib
		xs = append(xs, x)
		level = append(level, 300*mib+noise)
		grow = append(grow, 300*mib+noise+x*90)
	}
	level[len(level)-1] += 2 * mib // one wild reading, last
	if got, err := Trend(xs, level); err != nil || math.Abs(got) > 5 {
		t.Errorf("Trend(level with one wild reading) = %v bytes a key, %v; want about 0", got, err)
	}
	if got, err := Trend(xs, grow); err != nil || math.Abs(got-90) > 5 {
		t.Errorf("Trend(90 bytes a key) = %v, %v; want about 90", got, err)
	}
	if _, err := Trend(xs[:2], level[:2]); err == nil {
		t.Error("Trend of two readings: no error")
	}
	if _, err := Trend([]float64{1, 1, 1}, []float64{1, 2, 3}); err == nil {
		t.Error("Trend with one x: no error")
	}
}
