// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoytest

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// UpstreamOptions configures an Upstream. The zero value answers every
// request at once with 200 and the body "ok\n".
type UpstreamOptions struct {
	// Status is the response status; 0 means 200.
	Status int
	// BodySize, when > 0, makes the body that many bytes of 'x'.
	BodySize int
	// Delay holds every response back that long (or until the request is
	// cancelled).
	Delay time.Duration
}

// Upstream is an in-process HTTP/1.1 server on 127.0.0.1 for Envoy to route
// to. It counts the requests it receives and remembers the headers of the
// last one. It is safe for concurrent use.
type Upstream struct {
	srv      *httptest.Server
	opts     UpstreamOptions
	body     []byte
	requests atomic.Int64

	mu   sync.Mutex
	last http.Header
}

// StartUpstream starts an Upstream; it is closed in t.Cleanup.
func StartUpstream(t testing.TB, opts UpstreamOptions) *Upstream {
	t.Helper()
	if opts.Status == 0 {
		opts.Status = http.StatusOK
	}
	if opts.Status < 100 || opts.Status > 999 {
		t.Fatalf("envoytest: UpstreamOptions.Status: want 100..999, got %d", opts.Status)
	}
	if opts.BodySize < 0 {
		t.Fatalf("envoytest: UpstreamOptions.BodySize: want >= 0, got %d", opts.BodySize)
	}
	u := &Upstream{opts: opts, body: []byte("ok\n")}
	if opts.BodySize > 0 {
		u.body = bytes.Repeat([]byte{'x'}, opts.BodySize)
	}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serveHTTP))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *Upstream) serveHTTP(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	h := r.Header.Clone()
	h.Set("Host", r.Host)
	u.mu.Lock()
	u.last = h
	u.mu.Unlock()
	if u.opts.Delay > 0 {
		timer := time.NewTimer(u.opts.Delay)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Content-Length", strconv.Itoa(len(u.body)))
	w.WriteHeader(u.opts.Status)
	_, _ = w.Write(u.body)
}

// Port is the port the upstream listens on, for Options.UpstreamPort.
func (u *Upstream) Port() int {
	_, p, err := net.SplitHostPort(u.srv.Listener.Addr().String())
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return 0
	}
	return n
}

// URL is the upstream's base URL, e.g. "http://127.0.0.1:41234".
func (u *Upstream) URL() string { return u.srv.URL }

// Requests is the number of requests received so far.
func (u *Upstream) Requests() int64 { return u.requests.Load() }

// LastHeader returns a copy of the headers of the last request received
// (with its Host), nil before the first one.
func (u *Upstream) LastHeader() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last.Clone()
}
