// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package wasmhost

import (
	"bytes"
	"fmt"
	"testing"
)

func TestPairsRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		h    Headers
		want []byte
	}{
		{"empty", Headers{}, []byte{0, 0, 0, 0}},
		{"one", Headers{{"a", "bc"}}, []byte{1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 'a', 0, 'b', 'c', 0}},
		{"empty value", Headers{{"k", ""}, {"", "v"}}, []byte{2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 'k', 0, 0, 0, 'v', 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := encodePairs(tt.h)
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("encodePairs(%v) = %v, want %v", tt.h, got, tt.want)
			}
			back, err := decodePairs(got)
			if err != nil || fmt.Sprint(back) != fmt.Sprint(tt.h) {
				t.Fatalf("decodePairs = %v, %v, want %v", back, err, tt.h)
			}
		})
	}
}

func TestDecodePairsRejects(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
	}{
		{"short count", []byte{1, 0}},
		{"count beyond sizes", []byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"huge count", []byte{0xff, 0xff, 0xff, 0xff}},
		{"size beyond data", []byte{1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 'a', 0, 0}},
		{"missing nul", []byte{1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'a', 'b', 0}},
		{"trailing bytes", []byte{0, 0, 0, 0, 'x'}},
	}
	for _, tt := range tests {
		if h, err := decodePairs(tt.b); err == nil {
			t.Errorf("%s: decodePairs(%v) = %v, want an error", tt.name, tt.b, h)
		}
	}
}

func FuzzDecodePairs(f *testing.F) {
	f.Add([]byte{})
	f.Add(encodePairs(Headers{{":status", "200"}, {"x", ""}}))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodePairs(b)
		if err != nil || len(b) == 0 {
			return
		}
		if again := encodePairs(h); !bytes.Equal(again, b) {
			t.Fatalf("decode then encode changed %v into %v", b, again)
		}
	})
}

func TestHeaderEdits(t *testing.T) {
	tests := []struct {
		name string
		edit func(h *Headers)
		want string
	}{
		{"add lowercases", func(h *Headers) { h.add("X-A", "3") }, "[[x-a 1] [b 2] [x-a 2] [x-a 3]]"},
		{"replace keeps the first", func(h *Headers) { h.replace("X-A", "9") }, "[[x-a 9] [b 2]]"},
		{"replace appends", func(h *Headers) { h.replace("c", "3") }, "[[x-a 1] [b 2] [x-a 2] [c 3]]"},
		{"remove all", func(h *Headers) { h.remove("X-a") }, "[[b 2]]"},
		{"remove missing", func(h *Headers) { h.remove("zz") }, "[[x-a 1] [b 2] [x-a 2]]"},
	}
	for _, tt := range tests {
		h := Headers{{"x-a", "1"}, {"b", "2"}, {"x-a", "2"}}
		tt.edit(&h)
		if got := fmt.Sprint(h); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	h := Headers{{"X-A", "1"}, {"x-a", "2"}}
	if h.Get("x-a") != "1" || len(h.Values("X-A")) != 2 || h.Clone()[0][0] != "x-a" {
		t.Errorf("Get/Values/Clone on %v", h)
	}
	if PropertyPath("a", "b") != "a\x00b" {
		t.Error("PropertyPath")
	}
}
