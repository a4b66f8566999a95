// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"bufio"
	"bytes"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestReadResponse(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		wantStatus int
		wantKeep   bool
		wantErr    bool
		rest       string
	}{
		{"keep-alive", "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\nNEXT", 200, true, false, "NEXT"},
		{"case and spaces", "HTTP/1.1 429 Too Many Requests\r\nContent-Length:  5 \r\nX: y\r\n\r\nabcdeNEXT", 429, true, false, "NEXT"},
		{"no body", "HTTP/1.1 204 No Content\r\n\r\nNEXT", 204, true, false, "NEXT"},
		{"close", "HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 0\r\n\r\n", 200, false, false, ""},
		{"http/1.0", "HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", 200, false, false, ""},
		{"chunked", "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n", 0, false, true, ""},
		{"garbage", "SSH-2.0\r\n\r\n", 0, false, true, ""},
		{"status not a number", "HTTP/1.1 2x0 OK\r\n\r\n", 0, false, true, ""},
		{"header without colon", "HTTP/1.1 200 OK\r\nbroken\r\n\r\n", 0, false, true, ""},
		{"bad length", "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", 0, false, true, ""},
		{"huge length", "HTTP/1.1 200 OK\r\ncontent-length: 99999999\r\n\r\n", 0, false, true, ""},
		{"too many headers", "HTTP/1.1 200 OK\r\n" + strings.Repeat("a: b\r\n", 200) + "\r\n", 0, false, true, ""},
		{"truncated body", "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nok", 0, false, true, ""},
		{"empty", "", 0, false, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bufio.NewReader(strings.NewReader(tt.in))
			status, keep, err := ReadResponse(r)
			if (err != nil) != tt.wantErr || status != tt.wantStatus || keep != tt.wantKeep {
				t.Fatalf("ReadResponse() = %d, %v, %v; want %d, %v, error %v", status, keep, err, tt.wantStatus, tt.wantKeep, tt.wantErr)
			}
			if err == nil {
				rest := new(bytes.Buffer)
				rest.ReadFrom(r)
				if rest.String() != tt.rest {
					t.Errorf("left %q unread, want %q", rest, tt.rest)
				}
			}
		})
	}
}

func FuzzReadResponse(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
	f.Add("HTTP/1.1 429 x\r\n\r\n")
	f.Add("HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab")
	f.Fuzz(func(t *testing.T, in string) {
		status, _, err := ReadResponse(bufio.NewReader(strings.NewReader(in)))
		if err == nil && (status < 0 || status > 999) {
			t.Fatalf("ReadResponse(%q) = %d without an error", in, status)
		}
	})
}

func TestReadRequestHead(t *testing.T) {
	r := bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: a\r\n\r\n\r\nPOST /x HTTP/1.1\r\ncontent-length: 4\r\n\r\nbody"))
	if n, err := readRequestHead(r); n != 0 || err != nil {
		t.Fatalf("first head: %d, %v; want 0, nil", n, err)
	}
	if n, err := readRequestHead(r); n != 4 || err != nil {
		t.Fatalf("second head: %d, %v; want 4, nil", n, err)
	}
}

func keyRequests(n int) [][]byte {
	reqs := make([][]byte, n)
	for i := range reqs {
		reqs[i] = Request("GET", "/", "Host: t", "x-api-key: k"+strconv.Itoa(i))
	}
	return reqs
}

// TestLoadAgainstUpstream drives both loops against the upstream: every
// request answered with 200, none lost, the open loop at its rate.
func TestLoadAgainstUpstream(t *testing.T) {
	u, err := StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(u.Port()))
	end := time.Now().Add(200 * time.Millisecond)
	do, closeConns := HTTP(addr, 4, end, Cycle(keyRequests(3), 4))
	cs := make([]Counts, 4)
	lats := Closed(do, cs, time.Now(), end, func() { time.Sleep(200 * time.Millisecond) })
	closeConns()
	got := Sum(cs)
	if got.OK == 0 || got.Errors != 0 || got.Other != 0 || got.Rejected != 0 || got.OK != u.Requests() {
		t.Fatalf("closed loop: %+v, upstream saw %d; want only 200s, all seen", got, u.Requests())
	}
	if m := Merge(lats); int64(len(m.NS)) != got.OK || Percentile(m.NS, 0.5) <= 0 {
		t.Errorf("closed loop: %d samples for %d answers", len(m.NS), got.OK)
	}

	start := time.Now()
	end = start.Add(250 * time.Millisecond)
	do, closeConns = HTTP(addr, 2, end, Cycle(keyRequests(3), 2))
	defer closeConns()
	cs = make([]Counts, 2)
	m := Merge(Open(do, cs, 200, start, start.Add(50*time.Millisecond), end))
	if n := len(m.NS); n < 30 || n > 50 {
		t.Errorf("open loop at 200/s for 200 ms kept %d samples, want about 40", n)
	}
	if got := Sum(cs); got.Errors != 0 || got.OK < int64(len(m.NS)) {
		t.Errorf("open loop: %+v for %d samples", got, len(m.NS))
	}
}

func TestLoadStopsWhenServerDies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every dial fails
	start := time.Now()
	end := start.Add(100 * time.Millisecond)
	do, closeConns := HTTP(addr, 2, end, Cycle(keyRequests(1), 2))
	defer closeConns()
	cs := make([]Counts, 2)
	Closed(do, cs, time.Time{}, end, nil)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("closed loop took %v against a dead address", el)
	}
	if got := Sum(cs); got.Errors == 0 || got.Total() != 0 {
		t.Errorf("dead address: %+v, want only errors", got)
	}
}

func TestStop(t *testing.T) {
	cs := make([]Counts, 3)
	Closed(func(w int, n int64) (int, error) {
		if n >= 5 {
			return 0, ErrStop
		}
		return 200, nil
	}, cs, time.Time{}, time.Now().Add(time.Minute), nil)
	if got := Sum(cs); got.OK != 15 {
		t.Errorf("ErrStop after 5 requests per worker: %+v, want 15 OK", got)
	}
}

func TestPercentile(t *testing.T) {
	s := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tt := range []struct{ q, want float64 }{{0.5, 5}, {0.9, 9}, {0.99, 10}, {0, 1}, {1, 10}} {
		if got := Percentile(s, tt.q); got != tt.want {
			t.Errorf("Percentile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if Percentile(nil, 0.5) != 0 {
		t.Errorf("Percentile(nil) != 0")
	}
}

func BenchmarkReadResponse(b *testing.B) {
	const resp = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-type: text/plain\r\nserver: envoy\r\n\r\nok\n"
	src := strings.NewReader(resp)
	r := bufio.NewReader(src)
	b.ReportAllocs()
	for b.Loop() {
		src.Reset(resp)
		r.Reset(src)
		if _, _, err := ReadResponse(r); err != nil {
			b.Fatal(err)
		}
	}
}
