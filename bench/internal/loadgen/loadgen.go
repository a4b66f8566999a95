// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package loadgen is the project's one load generator: a closed loop (each
// worker sends its next request when the previous one is answered), an open
// loop at a fixed total rate, latency samples with nearest-rank percentiles,
// and outcome counts (200, 429, other statuses, transport errors), over any
// Target. HTTP is a Target that speaks just enough HTTP/1.1 over keep-alive
// loopback connections: it writes a prebuilt request and reads the status
// line, the headers and a Content-Length body, allocating nothing per
// request. Every run is bounded by its end time (plus IOSlack for a request
// in flight).
//
// Why not fortio or vegeta: the benchmarks cycle a header through many
// values (one x-api-key per request), which fortio's HTTP runner cannot; and
// measured on one core against the same loopback upstream, HTTP costs about
// 11 µs of client CPU per request, fortio's fast client 13–16 µs (one fixed
// request) and vegeta (net/http) 68 µs. See docs/RATIONALE.md.
package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// DialTimeout bounds a connection attempt; IOSlack is how long a request
	// in flight may outlive its run's end.
	DialTimeout = 2 * time.Second
	IOSlack     = 5 * time.Second
	// ErrorPause is how long a worker waits after a transport error, so a
	// dead server does not turn the loop into a busy one.
	ErrorPause = 10 * time.Millisecond
	// LateAfter is how far behind its schedule an open-loop send may start
	// before it counts as late; a worker more than DropAfter behind skips the
	// sends it missed (counted as dropped), so an overloaded server does not
	// turn the open loop into a closed one with an ever longer backlog.
	LateAfter = time.Millisecond
	DropAfter = 100 * time.Millisecond
)

// ErrStop, returned by a Target, ends its worker without being counted.
var ErrStop = errors.New("loadgen: stop")

// A Target sends worker w's n-th request (n from 0) and returns the
// response's status. It is called from w's goroutine only.
type Target func(w int, n int64) (status int, err error)

// Counts are one worker's outcomes. Its fields are atomics: they may be read
// (Sum) while the worker runs.
type Counts struct {
	OK, Rejected, Other, Errors atomic.Int64
	_                           [32]byte // keep workers off each other's cache line
}

// Add counts one outcome: 200 is OK, 429 Rejected.
func (c *Counts) Add(status int, err error) {
	switch {
	case err != nil:
		c.Errors.Add(1)
	case status == 200:
		c.OK.Add(1)
	case status == 429:
		c.Rejected.Add(1)
	default:
		c.Other.Add(1)
	}
}

// Tally is the sum of Counts at one moment.
type Tally struct{ OK, Rejected, Other, Errors int64 }

// Total is the number of answered requests.
func (t Tally) Total() int64 { return t.OK + t.Rejected + t.Other }

// Sub is t − u.
func (t Tally) Sub(u Tally) Tally {
	return Tally{t.OK - u.OK, t.Rejected - u.Rejected, t.Other - u.Other, t.Errors - u.Errors}
}

// Sum adds up cs.
func Sum(cs []Counts) Tally {
	var t Tally
	for i := range cs {
		t.OK += cs[i].OK.Load()
		t.Rejected += cs[i].Rejected.Load()
		t.Other += cs[i].Other.Load()
		t.Errors += cs[i].Errors.Load()
	}
	return t
}

// Latencies are one worker's samples (ns) and its schedule misses.
type Latencies struct {
	NS      []int64
	Late    int64 // open loop: sends that started more than LateAfter behind schedule
	Dropped int64 // open loop: scheduled sends skipped because the worker fell behind
}

// Merge joins the workers' samples, sorted.
func Merge(ls []Latencies) Latencies {
	var m Latencies
	for _, l := range ls {
		m.NS = append(m.NS, l.NS...)
		m.Late += l.Late
		m.Dropped += l.Dropped
	}
	slices.Sort(m.NS)
	return m
}

// Percentile is the nearest-rank q-quantile of sorted samples, 0 when there are none.
func Percentile(sorted []int64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return float64(sorted[max(0, min(i, len(sorted)-1))])
}

// Closed runs len(cs) workers, each sending its next request as soon as the
// previous one was answered, until end (or until the Target returns
// ErrStop). Requests that start at or after record (when record is not the
// zero time) are timed. during, when not nil, is called on the calling
// goroutine to measure while the load runs, and the workers stop when it
// returns; Closed returns once every worker stopped.
func Closed(do Target, cs []Counts, record, end time.Time, during func()) []Latencies {
	var stop atomic.Bool
	out := make([]Latencies, len(cs))
	var wg sync.WaitGroup
	for w := range cs {
		wg.Go(func() {
			for n := int64(0); !stop.Load(); n++ {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				status, err := do(w, n)
				if err == ErrStop {
					break
				}
				cs[w].Add(status, err)
				if err == nil && !record.IsZero() && !t0.Before(record) {
					out[w].NS = append(out[w].NS, int64(time.Since(t0)))
				}
			}
		})
	}
	if during != nil {
		during()
		stop.Store(true)
	}
	wg.Wait()
	return out
}

// Open sends rate requests per second in total from len(cs) workers from
// start until end: worker w sends its n-th request at start + (w +
// n·workers)/rate, or at once if it is behind. Latency runs from the actual
// send to the end of the response; sends that start late and sends skipped
// are counted, since then the offered rate was not met. Only sends scheduled
// from record on are timed.
func Open(do Target, cs []Counts, rate float64, start, record, end time.Time) []Latencies {
	conns := len(cs)
	out := make([]Latencies, conns)
	interval := time.Duration(float64(time.Second) * float64(conns) / rate)
	expect := int(end.Sub(record)/interval) + 16
	var wg sync.WaitGroup
	for w := range conns {
		wg.Go(func() {
			lat := Latencies{NS: make([]int64, 0, expect)}
			at := start.Add(time.Duration(float64(time.Second) * float64(w) / rate))
			var n int64
			skip := func(until func() bool) {
				for ; until() && at.Before(end); at, n = at.Add(interval), n+1 {
					if !at.Before(record) {
						lat.Dropped++
					}
				}
			}
			for at.Before(end) {
				now := time.Now()
				if !now.Before(end) {
					skip(func() bool { return true })
					break
				}
				if d := at.Sub(now); d > 0 {
					time.Sleep(d)
				} else if -d > DropAfter {
					skip(func() bool { return now.Sub(at) > LateAfter })
					continue
				}
				t0 := time.Now()
				status, err := do(w, n)
				t1 := time.Now()
				cs[w].Add(status, err)
				if !at.Before(record) && err == nil {
					lat.NS = append(lat.NS, int64(t1.Sub(t0)))
					if t0.Sub(at) > LateAfter {
						lat.Late++
					}
				}
				at, n = at.Add(interval), n+1
			}
			out[w] = lat
		})
	}
	wg.Wait()
	return out
}

// Request is a prebuilt HTTP/1.1 request without a body; header holds
// "Name: value" lines.
func Request(method, path string, header ...string) []byte {
	b := fmt.Appendf(nil, "%s %s HTTP/1.1\r\n", method, path)
	for _, h := range header {
		b = append(append(b, h...), "\r\n"...)
	}
	return append(b, "\r\n"...)
}

// HTTP returns a Target for conns workers, each on its own keep-alive
// connection to addr, sending req(w, n) as worker w's n-th request. I/O
// deadlines are at end + IOSlack. The close function closes the connections
// once the run is over.
func HTTP(addr string, conns int, end time.Time, req func(w int, n int64) []byte) (Target, func()) {
	cs := make([]conn, conns)
	deadline := end.Add(IOSlack)
	do := func(w int, n int64) (int, error) {
		c := &cs[w]
		status, keep, err := c.do(addr, req(w, n), deadline)
		if err != nil || !keep {
			c.close()
			if err != nil {
				time.Sleep(ErrorPause)
			}
		}
		return status, err
	}
	return do, func() {
		for i := range cs {
			cs[i].close()
		}
	}
}

// Cycle is a request function for HTTP that cycles through reqs, worker w
// of conns starting at reqs[w]: together the workers use them evenly.
func Cycle(reqs [][]byte, conns int) func(w int, n int64) []byte {
	return func(w int, n int64) []byte { return reqs[(int64(w)+n*int64(conns))%int64(len(reqs))] }
}

// conn is one keep-alive client connection.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func (c *conn) close() {
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
}

// do sends req and reads the response; it returns the status and whether
// the server keeps the connection open.
func (c *conn) do(addr string, req []byte, deadline time.Time) (status int, keep bool, err error) {
	if c.c == nil {
		nc, err := net.DialTimeout("tcp", addr, DialTimeout)
		if err != nil {
			return 0, false, err
		}
		if err := nc.SetDeadline(deadline); err != nil {
			nc.Close()
			return 0, false, err
		}
		c.c = nc
		if c.r == nil {
			c.r = bufio.NewReaderSize(nc, 16<<10)
		} else {
			c.r.Reset(nc)
		}
	}
	if _, err := c.c.Write(req); err != nil {
		return 0, false, err
	}
	return ReadResponse(c.r)
}

// ErrBadResponse is wrapped by ReadResponse's errors for what it cannot read.
var ErrBadResponse = errors.New("loadgen: malformed response")

// MaxBody bounds the body a response may announce.
const MaxBody = 1 << 20

// ReadResponse reads one HTTP/1.1 response with a Content-Length body (or
// none) from r: its status and whether the connection stays open.
func ReadResponse(r *bufio.Reader) (status int, keep bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, ErrBadResponse
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, false, ErrBadResponse
	}
	keep = line[7] == '1'
	length := 0
	for lines := 0; ; lines++ {
		if line, err = r.ReadSlice('\n'); err != nil {
			return 0, false, err
		}
		if len(line) <= 2 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || lines > 100 {
			return 0, false, ErrBadResponse
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("content-length")):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 || length > MaxBody {
				return 0, false, ErrBadResponse
			}
		case bytes.EqualFold(name, []byte("connection")):
			keep = !bytes.EqualFold(value, []byte("close"))
		case bytes.EqualFold(name, []byte("transfer-encoding")):
			return 0, false, fmt.Errorf("%w: transfer-encoding %s", ErrBadResponse, value)
		}
	}
	if _, err := r.Discard(length); err != nil {
		return 0, false, err
	}
	return status, keep, nil
}
