// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The load generator speaks just enough HTTP/1.1 over keep-alive loopback
// connections to drive Envoy: it writes a prebuilt GET per request and reads
// the status line, the headers and a Content-Length body. It does nothing
// per request that it can avoid (no allocation, no header map), so the core
// it runs on is not the bottleneck; net/http costs several times more CPU
// per request.

// dialTimeout and ioSlack bound every connection attempt and every read or
// write beyond the end of a run.
const (
	dialTimeout = 2 * time.Second
	ioSlack     = 5 * time.Second
)

// keyRequests returns one prebuilt request per x-api-key value k0..k(n-1).
func keyRequests(n int) [][]byte {
	reqs := make([][]byte, n)
	for i := range reqs {
		reqs[i] = fmt.Appendf(nil, "GET /bench HTTP/1.1\r\nHost: bench\r\nx-api-key: k%d\r\n\r\n", i)
	}
	return reqs
}

// conn is one keep-alive client connection.
type conn struct {
	addr string
	c    net.Conn
	r    *bufio.Reader
}

func (c *conn) dial(deadline time.Time) error {
	nc, err := net.DialTimeout("tcp", c.addr, dialTimeout)
	if err != nil {
		return err
	}
	if err := nc.SetDeadline(deadline); err != nil {
		nc.Close()
		return err
	}
	c.c = nc
	if c.r == nil {
		c.r = bufio.NewReaderSize(nc, 16<<10)
	} else {
		c.r.Reset(nc)
	}
	return nil
}

func (c *conn) close() {
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
}

var errBadResponse = errors.New("bench: malformed response")

// do sends req and reads the response; it returns the status and whether
// the server will keep the connection open.
func (c *conn) do(req []byte, deadline time.Time) (status int, keep bool, err error) {
	if c.c == nil {
		if err := c.dial(deadline); err != nil {
			return 0, false, err
		}
	}
	if _, err := c.c.Write(req); err != nil {
		return 0, false, err
	}
	return readResponse(c.r)
}

// readResponse reads one HTTP/1.1 response with a Content-Length body (or
// none) from r.
func readResponse(r *bufio.Reader) (status int, keep bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, errBadResponse
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, errBadResponse
	}
	keep = line[7] == '1'
	length := 0
	for {
		line, err = r.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		if len(line) <= 2 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, errBadResponse
		}
		value = bytes.TrimSpace(value)
		switch {
		case asciiEqualFold(name, "content-length"):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 {
				return 0, false, errBadResponse
			}
		case asciiEqualFold(name, "connection"):
			keep = !asciiEqualFold(value, "close")
		case asciiEqualFold(name, "transfer-encoding"):
			return 0, false, fmt.Errorf("%w: transfer-encoding %s", errBadResponse, value)
		}
	}
	if _, err := r.Discard(length); err != nil {
		return 0, false, err
	}
	return status, keep, nil
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// counts are the outcomes of one worker. Its fields are atomics: the
// controller reads them while the worker runs.
type counts struct {
	ok, rejected, other, errors atomic.Int64
	_                           [32]byte // keep workers off each other's cache line
}

func (c *counts) add(status int, err error) {
	switch {
	case err != nil:
		c.errors.Add(1)
	case status == 200:
		c.ok.Add(1)
	case status == 429:
		c.rejected.Add(1)
	default:
		c.other.Add(1)
	}
}

// tally is the sum of the workers' counts at one moment.
type tally struct{ ok, rejected, other, errors int64 }

func (t tally) total() int64 { return t.ok + t.rejected + t.other }

func (t tally) sub(u tally) tally {
	return tally{t.ok - u.ok, t.rejected - u.rejected, t.other - u.other, t.errors - u.errors}
}

func sum(cs []counts) tally {
	var t tally
	for i := range cs {
		t.ok += cs[i].ok.Load()
		t.rejected += cs[i].rejected.Load()
		t.other += cs[i].other.Load()
		t.errors += cs[i].errors.Load()
	}
	return t
}

// errorPause is how long a worker waits after a transport error before it
// reconnects, so a dead server does not turn the loop into a busy one.
const errorPause = 10 * time.Millisecond

// closedLoop runs conns workers, each sending its next request as soon as
// the previous answer arrived, until end. Worker i cycles through the keys
// starting at i, so the keys are used evenly. onWindow, called from the
// calling goroutine, does the measuring while the load runs; closedLoop
// returns after onWindow returned and every worker stopped (by end + ioSlack
// at the latest).
func closedLoop(addr string, reqs [][]byte, conns int, end time.Time, cs []counts, onWindow func()) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	deadline := end.Add(ioSlack)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &conn{addr: addr}
			defer c.close()
			k := i % len(reqs)
			for !stop.Load() && time.Now().Before(end) {
				status, keep, err := c.do(reqs[k], deadline)
				cs[i].add(status, err)
				if err != nil || !keep {
					c.close()
					if err != nil {
						time.Sleep(errorPause)
					}
				}
				k += conns
				for k >= len(reqs) {
					k -= len(reqs)
				}
			}
		}()
	}
	onWindow()
	stop.Store(true)
	wg.Wait()
}

// latencies are one worker's samples in ns.
type latencies struct {
	ns      []int64
	late    int64 // sends that started more than lateAfter behind schedule
	dropped int64 // scheduled sends skipped because the worker fell behind
}

// lateAfter is how far behind its schedule a send may start before it
// counts as late; a worker more than dropAfter behind skips the sends it
// missed (counted as dropped), so an overloaded Envoy does not make the
// open loop turn into a closed one with an ever longer backlog.
const (
	lateAfter = time.Millisecond
	dropAfter = 100 * time.Millisecond
)

// openLoop sends rate requests per second in total from conns workers, each
// on its own connection, from start until end: worker i sends its n-th
// request at start + (i + n·conns)/rate, or at once if it is behind.
// Latency runs from the actual send to the end of the response; sends that
// start late and sends skipped are counted, since then the offered rate was
// not met. Only sends scheduled from record on are counted. It returns by
// end + ioSlack at the latest.
func openLoop(addr string, reqs [][]byte, conns int, rate float64, start, record, end time.Time, cs []counts) []latencies {
	out := make([]latencies, conns)
	var wg sync.WaitGroup
	deadline := end.Add(ioSlack)
	interval := time.Duration(float64(time.Second) * float64(conns) / rate)
	expect := int(end.Sub(record)/interval) + 16
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &conn{addr: addr}
			defer c.close()
			lat := latencies{ns: make([]int64, 0, expect)}
			k := i % len(reqs)
			at := start.Add(time.Duration(float64(time.Second) * float64(i) / rate))
			next := func() {
				at = at.Add(interval)
				k += conns
				for k >= len(reqs) {
					k -= len(reqs)
				}
			}
			for at.Before(end) {
				now := time.Now()
				if !now.Before(end) {
					for ; at.Before(end); next() {
						if !at.Before(record) {
							lat.dropped++
						}
					}
					break
				}
				if d := at.Sub(now); d > 0 {
					time.Sleep(d)
				} else if -d > dropAfter {
					for ; now.Sub(at) > lateAfter && at.Before(end); next() {
						if !at.Before(record) {
							lat.dropped++
						}
					}
					continue
				}
				t0 := time.Now()
				status, keep, err := c.do(reqs[k], deadline)
				t1 := time.Now()
				cs[i].add(status, err)
				if !at.Before(record) && err == nil {
					lat.ns = append(lat.ns, int64(t1.Sub(t0)))
					if t0.Sub(at) > lateAfter {
						lat.late++
					}
				}
				if err != nil || !keep {
					c.close()
					if err != nil {
						time.Sleep(errorPause)
					}
				}
				next()
			}
			out[i] = lat
		}()
	}
	wg.Wait()
	return out
}

// upstream is a minimal HTTP/1.1 server on 127.0.0.1 answering every
// request with 200 "ok\n"; it reads request heads and Content-Length
// bodies, nothing else. Like the generator it is cheap per request, so the
// core that runs both does not limit Envoy's throughput.
type upstream struct {
	ln       net.Listener
	requests atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

var upstreamResponse = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n")

func startUpstream() (*upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{ln: ln, conns: make(map[net.Conn]bool)}
	u.wg.Add(1)
	go u.serve()
	return u, nil
}

func (u *upstream) port() int { return u.ln.Addr().(*net.TCPAddr).Port }

func (u *upstream) serve() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.conns[c] = true
		u.mu.Unlock()
		u.wg.Add(1)
		go u.handle(c)
	}
}

func (u *upstream) handle(c net.Conn) {
	defer u.wg.Done()
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
		if ok && asciiEqualFold(name, "content-length") {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil || length < 0 {
				return 0, io.ErrUnexpectedEOF
			}
		}
	}
}

// close stops accepting, closes every connection and waits for the
// handlers.
func (u *upstream) close() {
	u.ln.Close()
	u.mu.Lock()
	for c := range u.conns {
		c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}
