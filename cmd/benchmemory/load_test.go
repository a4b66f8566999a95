// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestReadResponse(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		wantStatus int
		wantErr    error // errors.Is; nil: no error
		wantRest   string
	}{
		{"body", "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\nNEXT", 200, nil, "NEXT"},
		{"no body", "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nx: y\r\n\r\nNEXT", 429, nil, "NEXT"},
		{"no length", "HTTP/1.1 204 No Content\r\n\r\nNEXT", 204, nil, "NEXT"},
		{"http/1.0", "HTTP/1.0 503 Service Unavailable\r\nContent-Length: 1\r\n\r\nxNEXT", 503, nil, "NEXT"},
		{"bad status line", "HTTP/2 200\r\n\r\n", 0, errMalformed, ""},
		{"status not a number", "HTTP/1.1 2x0 OK\r\n\r\n", 0, errMalformed, ""},
		{"header without colon", "HTTP/1.1 200 OK\r\nbroken\r\n\r\n", 0, errMalformed, ""},
		{"negative length", "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", 0, errMalformed, ""},
		{"huge length", "HTTP/1.1 200 OK\r\ncontent-length: 99999999\r\n\r\n", 0, errMalformed, ""},
		{"chunked", "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", 0, errMalformed, ""},
		{"too many headers", "HTTP/1.1 200 OK\r\n" + strings.Repeat("a: b\r\n", maxHeaderLines) + "\r\n", 0, errMalformed, ""},
		{"truncated body", "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab", 0, nil, ""},
		{"empty", "", 0, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bufio.NewReader(strings.NewReader(tt.in))
			status, err := readResponse(r)
			switch {
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("readResponse() error = %v, want %v", err, tt.wantErr)
			case tt.wantStatus == 0 && err == nil:
				t.Fatalf("readResponse() = %d, want an error", status)
			case tt.wantStatus != 0 && (err != nil || status != tt.wantStatus):
				t.Fatalf("readResponse() = %d, %v; want %d", status, err, tt.wantStatus)
			}
			if tt.wantRest != "" {
				rest, _ := r.ReadString(0)
				if rest != tt.wantRest {
					t.Fatalf("left %q unread, want %q", rest, tt.wantRest)
				}
			}
		})
	}
}

func FuzzReadResponse(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
	f.Add("HTTP/1.1 429 x\r\n\r\n")
	f.Add("HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab")
	f.Add("HTTP/1.1 999 \n\n")
	f.Fuzz(func(t *testing.T, in string) {
		status, err := readResponse(bufio.NewReader(strings.NewReader(in)))
		if err == nil && (status < 0 || status > 999) {
			t.Fatalf("readResponse(%q) = %d without an error", in, status)
		}
	})
}

func BenchmarkReadResponse(b *testing.B) {
	const resp = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-type: text/plain\r\ndate: Sat, 21 Nov 2026 20:00:00 GMT\r\nserver: envoy\r\n\r\nok\n"
	r := bufio.NewReader(strings.NewReader(""))
	src := strings.NewReader(resp)
	b.ReportAllocs()
	for b.Loop() {
		src.Reset(resp)
		r.Reset(src)
		if _, err := readResponse(r); err != nil {
			b.Fatal(err)
		}
	}
}

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
