// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
)

// keyServer answers 200 and records the x-api-key of every request.
type keyServer struct {
	mu   sync.Mutex
	keys map[string]int
}

func (s *keyServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.keys[r.Header.Get("x-api-key")]++
	s.mu.Unlock()
	if r.URL.Path == "/reject" {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

func TestFlood(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		cycle      int
		from, to   int
		wantKeys   int
		wantStatus int
	}{
		{"distinct keys", "/", 0, 100, 1100, 1000, 200},
		{"cycle", "/", 7, 0, 500, 7, 200},
		{"statuses", "/reject", 0, 0, 50, 50, 429},
		{"nothing", "/", 0, 5, 5, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ks := &keyServer{keys: map[string]int{}}
			srv := httptest.NewServer(ks)
			defer srv.Close()
			f := flood{addr: srv.Listener.Addr().String(), path: tt.path, prefix: "k-", cycle: tt.cycle, conns: 8}
			res, err := f.run(tt.from, tt.to)
			if err != nil {
				t.Fatal(err)
			}
			if n := res.requests(); n != tt.to-tt.from || res.Errors != 0 {
				t.Fatalf("%d requests answered, %d errors; want %d and 0", n, res.Errors, tt.to-tt.from)
			}
			if tt.wantStatus != 0 && res.Statuses[tt.wantStatus] != tt.to-tt.from {
				t.Fatalf("statuses %v, want all %d", res.Statuses, tt.wantStatus)
			}
			if len(ks.keys) != tt.wantKeys {
				t.Fatalf("server saw %d distinct keys, want %d", len(ks.keys), tt.wantKeys)
			}
			if tt.wantKeys > 0 && tt.cycle == 0 {
				if ks.keys["k-"+strconv.Itoa(tt.from)] != 1 || ks.keys["k-"+strconv.Itoa(tt.to-1)] != 1 {
					t.Fatalf("first or last key missing: %d, %d", ks.keys["k-"+strconv.Itoa(tt.from)], ks.keys["k-"+strconv.Itoa(tt.to-1)])
				}
			}
		})
	}
}

// TestFloodStopsOnErrors: a target that closes every connection ends the
// flood after maxErrors errors instead of trying every key.
func TestFloodStopsOnErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	f := flood{addr: l.Addr().String(), path: "/", prefix: "k-", conns: 4}
	res, err := f.run(0, 1_000_000)
	if err == nil {
		t.Fatal("run() succeeded against a target that closes every connection")
	}
	if res.Errors < maxErrors || res.Errors > maxErrors+f.conns {
		t.Fatalf("%d errors, want about %d", res.Errors, maxErrors)
	}
}
