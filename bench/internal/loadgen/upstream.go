// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
)

// Upstream is a minimal HTTP/1.1 server on 127.0.0.1 answering every
// request with 200 "ok\n"; it reads request heads and Content-Length
// bodies, nothing else. Like HTTP it is cheap per request, so the core that
// runs both does not limit the server under test.
type Upstream struct {
	ln       net.Listener
	requests atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

var upstreamResponse = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n")

// StartUpstream listens on a free loopback port and serves until Close.
func StartUpstream() (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{ln: ln, conns: make(map[net.Conn]bool)}
	u.wg.Go(u.serve)
	return u, nil
}

// Port is the port it listens on; Requests how many requests it answered.
func (u *Upstream) Port() int       { return u.ln.Addr().(*net.TCPAddr).Port }
func (u *Upstream) Requests() int64 { return u.requests.Load() }

func (u *Upstream) serve() {
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.conns[c] = true
		u.mu.Unlock()
		u.wg.Go(func() { u.handle(c) })
	}
}

func (u *Upstream) handle(c net.Conn) {
	defer func() {
		u.mu.Lock()
		delete(u.conns, c)
		u.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, 16<<10)
	for {
		length, err := readRequestHead(r)
		if err != nil {
			return
		}
		if _, err := r.Discard(length); err != nil {
			return
		}
		u.requests.Add(1)
		if _, err := c.Write(upstreamResponse); err != nil {
			return
		}
	}
}

// readRequestHead reads a request line and headers and returns the
// Content-Length (0 when absent).
func readRequestHead(r *bufio.Reader) (int, error) {
	first := true
	length := 0
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(line) <= 2 {
			if first {
				continue // tolerate a stray CRLF between requests
			}
			return length, nil
		}
		if first {
			first = false
			continue
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(name, []byte("content-length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil || length < 0 {
				return 0, io.ErrUnexpectedEOF
			}
		}
	}
}

// Close stops accepting, closes every connection and waits for the handlers.
func (u *Upstream) Close() {
	u.ln.Close()
	u.mu.Lock()
	for c := range u.conns {
		c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}
