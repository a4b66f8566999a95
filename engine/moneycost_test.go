package engine

import "testing"

func TestMoneyCost(t *testing.T) {
	for _, tc := range []struct {
		usage, price []uint64
		per, want    uint64
	}{
		{[]uint64{1}, []uint64{1}, 1000000, 1}, // a millionth of a millionth: rounded up
		{[]uint64{1000000}, []uint64{2500000}, 1000000, 2500000},
		{[]uint64{3, 4}, []uint64{1, 1}, 7, 1},
		{[]uint64{1 << 53}, []uint64{1 << 40}, 1, 1 << 53}, // past 64 bits: capped
		{[]uint64{1 << 53, 1 << 53}, []uint64{1 << 40, 1 << 40}, 1 << 40, 1 << 53},
	} {
		if got := moneyCost(tc.usage, tc.price, tc.per); got != tc.want {
			t.Errorf("moneyCost(%v, %v, %d) = %d, want %d", tc.usage, tc.price, tc.per, got, tc.want)
		}
	}
}
