// Command grpcattack attacks a gRPC door (limitd's --grpc-listen) the way
// an unauthenticated client on the network can, speaking HTTP/2 frames
// itself, and prints what it saw as one JSON line. The end-to-end test of
// the door (e2e/grpcdoor_test.go) runs it as a process of its own against
// the real build/limitd. It refuses any address but a loopback one, and
// every mode is bounded in connections, streams, bytes and time.
//
//	grpcattack -addr 127.0.0.1:PORT -mode MODE [-conns N] [-streams N] [-for D] [-token T] [-mixed]
//
// Each connection's part lasts -for from its dialing (at most; it ends when
// the server closes the connection).
//
// Modes:
//
//	holders     N connections, half sending only the HTTP/2 preface, half
//	            holding a grpc.health.v1.Health/Watch stream without a
//	            token; held -for, counting those the server closes.
//	unfinished  N connections, each opening -streams streams without a
//	            token (health Checks; with -mixed, ShouldRateLimit calls
//	            in turn), each sending most of a message that never ends;
//	            held -for.
//	reset       N connections doing rapid reset (HEADERS, DATA,
//	            RST_STREAM) until the server closes them, at most a million
//	            streams each or -for; with -token, every other connection
//	            carries it.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Bounds of every mode.
const (
	maxConns     = 4096
	maxStreams   = 256
	maxFor       = 2 * time.Minute
	maxResets    = 1_000_000
	chunkBytes   = 15 << 10 // of an unfinished message, per DATA frame
	messageBytes = 60 << 10 // of an unfinished message sent (of 64 KiB announced)
)

// Report is what the attack saw.
type Report struct {
	Mode string `json:"mode"`
	// Opened: connections whose HTTP/2 handshake completed; Refused: the
	// others (closed by the server at once).
	Opened  int `json:"opened"`
	Refused int `json:"refused"`
	// Closed: opened connections the server closed before the attack
	// ended; ClosedAfter: when the last of them was closed.
	Closed      int     `json:"closed"`
	ClosedAfter float64 `json:"closed_after_s"`
	// Streams: streams opened; DataBytes: message bytes sent.
	Streams   int   `json:"streams"`
	DataBytes int64 `json:"data_bytes"`
	// Resets: RST_STREAM frames sent (mode reset).
	Resets  int64   `json:"resets"`
	Seconds float64 `json:"seconds"`
}

func main() {
	addr := flag.String("addr", "", "the door's address (loopback only)")
	mode := flag.String("mode", "", "holders, unfinished or reset")
	conns := flag.Int("conns", 96, "connections")
	streams := flag.Int("streams", 8, "streams per connection (unfinished)")
	hold := flag.Duration("for", 15*time.Second, "how long each connection's part of the attack lasts, from its dialing")
	token := flag.String("token", "", "a bearer token (reset: every other connection carries it)")
	mixed := flag.Bool("mixed", false, "unfinished: every other stream calls ShouldRateLimit (else health Check only)")
	flag.Parse()
	if err := run(*addr, *mode, *conns, *streams, *hold, *token, *mixed); err != nil {
		fmt.Fprintln(os.Stderr, "grpcattack:", err)
		os.Exit(2)
	}
}

func run(addr, mode string, conns, streams int, hold time.Duration, token string, mixed bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %s: loopback addresses only", addr)
	}
	switch {
	case conns < 1 || conns > maxConns:
		return fmt.Errorf("-conns: 1 to %d, got %d", maxConns, conns)
	case streams < 1 || streams > maxStreams:
		return fmt.Errorf("-streams: 1 to %d, got %d", maxStreams, streams)
	case hold <= 0 || hold > maxFor:
		return fmt.Errorf("-for: up to %v, got %v", maxFor, hold)
	}
	a := &attack{addr: addr, start: time.Now(), hold: hold, token: token}
	a.report.Mode = mode
	var each func(i int, c *client)
	switch mode {
	case "holders":
		each = a.holder
	case "unfinished":
		each = func(i int, c *client) { a.unfinished(c, streams, mixed) }
	case "reset":
		each = a.reset
	default:
		return fmt.Errorf("-mode: holders, unfinished or reset, got %q", mode)
	}
	var wg sync.WaitGroup
	for i := range conns {
		c, err := a.dial()
		if err != nil {
			a.count(func(r *Report) { r.Refused++ })
			continue
		}
		a.count(func(r *Report) { r.Opened++ })
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.conn.Close()
			each(i, c)
			if c.waitClosed() {
				a.count(func(r *Report) {
					r.Closed++
					r.ClosedAfter = max(r.ClosedAfter, c.closedAt.Sub(a.start).Seconds())
				})
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "grpcattack: dialed %d connections\n", conns)
	wg.Wait()
	a.report.Seconds = time.Since(a.start).Seconds()
	return json.NewEncoder(os.Stdout).Encode(&a.report)
}

type attack struct {
	addr   string
	start  time.Time
	hold   time.Duration // each connection's, from its dialing
	token  string
	mu     sync.Mutex
	report Report
}

func (a *attack) count(f func(*Report)) {
	a.mu.Lock()
	f(&a.report)
	a.mu.Unlock()
}

// client is one raw HTTP/2 connection; a goroutine reads (and drops) what
// the server sends, until it closes.
type client struct {
	conn     net.Conn
	fr       *http2.Framer
	wmu      sync.Mutex // the framer's writes
	enc      *hpack.Encoder
	hbuf     bytes.Buffer
	next     uint32
	done     chan struct{} // closed when the server closed the connection
	closedAt time.Time
	end      time.Time // the connection's part of the attack ends
}

func (a *attack) dial() (*client, error) {
	conn, err := net.DialTimeout("tcp", a.addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	c := &client{conn: conn, fr: http2.NewFramer(conn, conn), next: 1, done: make(chan struct{}), end: time.Now().Add(a.hold)}
	c.enc = hpack.NewEncoder(&c.hbuf)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err == nil {
		err = c.fr.WriteSettings()
	}
	for err == nil {
		var f http2.Frame
		if f, err = c.fr.ReadFrame(); err == nil {
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				err = c.fr.WriteSettingsAck()
				break
			}
		}
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	go func() {
		buf := make([]byte, 32<<10)
		for {
			if _, err := conn.Read(buf); err != nil {
				c.closedAt = time.Now()
				close(c.done)
				return
			}
		}
	}()
	return c, nil
}

// waitClosed waits until the server closes the connection (true) or its
// end.
func (c *client) waitClosed() bool {
	select {
	case <-c.done:
		return true
	case <-time.After(time.Until(c.end)):
		return false
	}
}

func (c *client) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// open sends the HEADERS of a call to method (with token unless empty).
func (c *client) open(method, token string) (uint32, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.Reset()
	for _, hf := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "limitd"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = c.enc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]})
	}
	if token != "" {
		_ = c.enc.WriteField(hpack.HeaderField{Name: "authorization", Value: "Bearer " + token})
	}
	id := c.next
	c.next += 2
	return id, c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
}

func (c *client) data(id uint32, p []byte, end bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.fr.WriteData(id, end, p)
}

func (c *client) rst(id uint32) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
}

const (
	watchMethod = "/grpc.health.v1.Health/Watch"
	checkMethod = "/grpc.health.v1.Health/Check"
	rlsMethod   = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
)

// holder: the even connections send nothing more; the odd ones hold a
// health Watch (an empty request: all services).
func (a *attack) holder(i int, c *client) {
	if i%2 == 0 {
		return
	}
	id, err := c.open(watchMethod, "")
	if err == nil {
		err = c.data(id, []byte{0, 0, 0, 0, 0}, true)
	}
	if err == nil {
		a.count(func(r *Report) { r.Streams++ })
	}
}

// unfinished opens streams streams, each sending messageBytes of a message
// announced as 64 KiB - 1, never finished: health Checks, or with mixed
// every other one a ShouldRateLimit call.
func (a *attack) unfinished(c *client, streams int, mixed bool) {
	chunk := make([]byte, chunkBytes)
	for s := range streams {
		method := checkMethod
		if mixed && s%2 == 1 {
			method = rlsMethod
		}
		id, err := c.open(method, "")
		if err != nil {
			return
		}
		a.count(func(r *Report) { r.Streams++ })
		prefix := []byte{0, 0, 0, 0xff, 0xff} // uncompressed, 65,535 bytes
		if err := c.data(id, prefix, false); err != nil {
			return
		}
		for sent := 0; sent < messageBytes; sent += chunkBytes {
			if c.closed() || time.Now().After(c.end) {
				return
			}
			if err := c.data(id, chunk, false); err != nil {
				return
			}
			a.count(func(r *Report) { r.DataBytes += chunkBytes })
		}
	}
}

// reset does rapid reset until the server closes the connection, maxResets
// or the end.
func (a *attack) reset(i int, c *client) {
	token := ""
	if i%2 == 1 {
		token = a.token
	}
	msg := []byte{0, 0, 0, 0, 8, 10, 3, 'r', 'l', 's'} // a message of 8 bytes, 5 sent
	var n int64
	defer func() { a.count(func(r *Report) { r.Resets += n; r.Streams += int(n) }) }()
	for n < maxResets && !c.closed() && (n%1024 != 0 || time.Now().Before(c.end)) {
		id, err := c.open(rlsMethod, token)
		if err == nil {
			err = c.data(id, msg, false)
		}
		if err == nil {
			err = c.rst(id)
		}
		if err != nil {
			return
		}
		n++
	}
}
