// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of the load generator.
const (
	// ioTimeout bounds each request's write and its response's read.
	ioTimeout = 10 * time.Second
	// maxErrors ends a flood early: after that many transport errors the
	// target is assumed gone.
	maxErrors = 100
	// maxHeaderLines bounds the lines read from one response head.
	maxHeaderLines = 100
	// maxBody bounds the body a response may announce.
	maxBody = 1 << 20
)

// flood sends one GET per index i in [from, to) to addr over conns
// keep-alive HTTP/1.1 connections, concurrently, each request carrying the
// header x-api-key: <prefix><i> (or <prefix><i % cycle>). It is a minimal client (no redirects,
// no chunked bodies: Envoy's local and direct responses announce their
// length), written to keep the load generator's CPU small next to Envoy's on
// a small machine. It returns the count of each status and stops early after
// maxErrors transport errors.
type flood struct {
	addr   string // host:port on loopback
	path   string
	prefix string // of the x-api-key values
	cycle  int    // when > 0, request i uses key i % cycle
	conns  int
}

// floodResult counts what a flood got back.
type floodResult struct {
	Statuses map[int]int
	Errors   int
	Elapsed  time.Duration
}

func (r floodResult) requests() int {
	n := 0
	for _, c := range r.Statuses {
		n += c
	}
	return n
}

// run sends the requests for key indexes [from, to).
func (f flood) run(from, to int) (floodResult, error) {
	if from >= to {
		return floodResult{Statuses: map[int]int{}}, nil
	}
	var next atomic.Int64
	next.Store(int64(from))
	var errCount atomic.Int64
	var mu sync.Mutex
	res := floodResult{Statuses: map[int]int{}}
	var firstErr error
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < f.conns; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[int]int{}
			var c *conn
			defer func() {
				if c != nil {
					c.close()
				}
			}()
			for errCount.Load() < maxErrors {
				i := next.Add(1) - 1
				if i >= int64(to) {
					break
				}
				var status int
				var err error
				for attempt := 0; attempt < 2; attempt++ { // one retry on a fresh connection
					if c == nil {
						if c, err = dial(f.addr); err != nil {
							continue
						}
					}
					key := i
					if f.cycle > 0 {
						key %= int64(f.cycle)
					}
					status, err = c.get(f.path, f.prefix, key)
					if err == nil {
						break
					}
					c.close()
					c = nil
				}
				if err != nil {
					errCount.Add(1)
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				local[status]++
			}
			mu.Lock()
			for s, n := range local {
				res.Statuses[s] += n
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.Errors = int(errCount.Load())
	if res.Errors >= maxErrors {
		return res, fmt.Errorf("benchmemory: flood stopped after %d transport errors, first: %w", res.Errors, firstErr)
	}
	return res, nil
}

// conn is one keep-alive HTTP/1.1 connection.
type conn struct {
	nc  net.Conn
	r   *bufio.Reader
	buf []byte // request scratch
}

func dial(addr string) (*conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &conn{nc: nc, r: bufio.NewReaderSize(nc, 16<<10)}, nil
}

func (c *conn) close() { _ = c.nc.Close() }

var errMalformed = errors.New("benchmemory: malformed response")

// get sends GET path with x-api-key <prefix><i> and reads the response.
func (c *conn) get(path, prefix string, i int64) (int, error) {
	b := append(c.buf[:0], "GET "...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: bench\r\nx-api-key: "...)
	b = append(b, prefix...)
	b = strconv.AppendInt(b, i, 10)
	b = append(b, "\r\n\r\n"...)
	c.buf = b
	if err := c.nc.SetDeadline(time.Now().Add(ioTimeout)); err != nil {
		return 0, err
	}
	if _, err := c.nc.Write(b); err != nil {
		return 0, err
	}
	return readResponse(c.r)
}

// readResponse reads one HTTP/1.1 response with a Content-Length body (or
// none) and returns its status.
func readResponse(r *bufio.Reader) (int, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	length := 0
	for n := 0; ; n++ {
		if n == maxHeaderLines {
			return 0, fmt.Errorf("%w: more than %d header lines", errMalformed, maxHeaderLines)
		}
		line, err = r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, fmt.Errorf("%w: header line %q", errMalformed, line)
		}
		switch {
		case bytes.EqualFold(name, []byte("content-length")):
			length, err = strconv.Atoi(string(bytes.TrimSpace(value)))
			if err != nil || length < 0 || length > maxBody {
				return 0, fmt.Errorf("%w: content-length %q", errMalformed, value)
			}
		case bytes.EqualFold(name, []byte("transfer-encoding")):
			return 0, fmt.Errorf("%w: transfer-encoding is not supported", errMalformed)
		}
	}
	if _, err := r.Discard(length); err != nil {
		return 0, err
	}
	return status, nil
}
