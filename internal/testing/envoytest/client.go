// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoytest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

const (
	// RequestTimeout bounds every request a Client makes, body included.
	RequestTimeout = 10 * time.Second
	// MaxBurst is the largest n Burst accepts.
	MaxBurst = 1000
	// maxBody bounds how much of a response body a Client keeps.
	maxBody = 64 << 20
)

// Result is the outcome of one request.
type Result struct {
	Status int
	Header http.Header
	Body   []byte
	// Elapsed runs from sending the request to reading the whole body.
	Elapsed time.Duration
	// Err is a transport error. Status is 0 when no response arrived.
	Err error
}

func (r Result) String() string {
	if r.Err != nil {
		return "error: " + r.Err.Error()
	}
	return fmt.Sprintf("%d %q", r.Status, truncate(r.Body, 200))
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}

// Client sends requests to one base URL over keep-alive loopback
// connections. It is safe for concurrent use and never fails a test itself:
// errors are in Result.Err.
type Client struct {
	base string
	hc   *http.Client
}

// NewClient returns a Client for base, e.g. "http://127.0.0.1:10000".
func NewClient(base string) *Client { return NewClientTimeout(base, RequestTimeout) }

// NewClientTimeout is NewClient with its own bound on each request, for a
// test that bounds something else (the CPU a request waits for) and must
// not fail on a loaded machine's wait.
func NewClientTimeout(base string, timeout time.Duration) *Client {
	tr := &http.Transport{
		Proxy:               nil, // loopback only: never a proxy from the environment
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConns:        MaxBurst,
		MaxIdleConnsPerHost: MaxBurst,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &Client{base: strings.TrimRight(base, "/"), hc: &http.Client{Transport: tr, Timeout: timeout}}
}

// Close closes the idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// NewRequest builds a request for path (with its query, if any) relative to
// the base URL. A "Host" entry of headers sets the request's Host. It returns
// nil when method or path is invalid; Do and Burst report that as an error.
func (c *Client) NewRequest(method, path string, headers map[string]string) *http.Request {
	req, err := http.NewRequest(method, c.base+path, nil)
	if err != nil {
		return nil
	}
	for k, v := range headers {
		if http.CanonicalHeaderKey(k) == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	return req
}

var errNilRequest = errors.New("envoytest: invalid request (nil)")

// Do sends a request without a body and reads the whole response.
func (c *Client) Do(method, path string, headers map[string]string) Result {
	return c.DoRequest(c.NewRequest(method, path, headers))
}

// Get is Do with method GET.
func (c *Client) Get(path string, headers map[string]string) Result {
	return c.Do(http.MethodGet, path, headers)
}

// DoRequest sends req and reads the whole response (up to 64 MiB).
func (c *Client) DoRequest(req *http.Request) Result {
	if req == nil {
		return Result{Err: errNilRequest}
	}
	start := time.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		return Result{Err: err, Elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	r := Result{Status: resp.StatusCode, Header: resp.Header, Body: body, Elapsed: time.Since(start)}
	if err != nil {
		r.Err = fmt.Errorf("envoytest: reading body: %w", err)
	}
	return r
}

// Burst sends n requests at once and returns their results in order of i.
// It builds all n requests with mk first, starts one goroutine per request,
// and releases them together once all are waiting (a start barrier), so the
// requests reach Envoy as close together as the scheduler allows. It returns
// when every request has finished, within RequestTimeout. n must be in
// 1..MaxBurst; otherwise every result carries an error.
func (c *Client) Burst(n int, mk func(i int) *http.Request) []Result {
	if n <= 0 {
		return nil
	}
	results := make([]Result, n)
	if n > MaxBurst {
		err := fmt.Errorf("envoytest: burst of %d: want at most %d", n, MaxBurst)
		for i := range results {
			results[i].Err = err
		}
		return results
	}
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = mk(i)
	}
	var ready, done sync.WaitGroup
	ready.Add(n)
	done.Add(n)
	start := make(chan struct{})
	for i := range reqs {
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			results[i] = c.DoRequest(reqs[i])
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return results
}

// Statuses counts the results by status; transport errors count as status 0.
func Statuses(results []Result) map[int]int {
	m := make(map[int]int)
	for _, r := range results {
		m[r.Status]++
	}
	return m
}
