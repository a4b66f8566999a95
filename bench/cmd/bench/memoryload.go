// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bench/internal/loadgen"
)

// Bounds of a flood.
const (
	// maxErrors ends a flood early: after that many transport errors the
	// target is assumed gone.
	maxErrors = 100
	// floodLimit bounds a flood's time.
	floodLimit = 30 * time.Minute
)

// flood sends one GET per index i in [from, to) to addr over conns
// keep-alive HTTP/1.1 connections (internal/loadgen's closed loop),
// concurrently, each request carrying the header x-api-key: <prefix><i> (or
// <prefix><i % cycle>). A request that fails is retried once on a fresh
// connection. It returns the count of each status and stops early after
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
	res := floodResult{Statuses: map[int]int{}}
	if from >= to {
		return res, nil
	}
	var next, errs atomic.Int64
	next.Store(int64(from))
	keys := make([]int64, f.conns)
	bufs := make([][]byte, f.conns)
	start := time.Now()
	send, closeConns := loadgen.HTTP(f.addr, f.conns, start.Add(floodLimit), func(w int, _ int64) []byte {
		b := append(bufs[w][:0], "GET "+f.path+" HTTP/1.1\r\nHost: bench\r\nx-api-key: "+f.prefix...)
		b = append(strconv.AppendInt(b, keys[w], 10), "\r\n\r\n"...)
		bufs[w] = b
		return b
	})
	defer closeConns()
	var mu sync.Mutex
	var firstErr error
	statuses := make([]map[int]int, f.conns)
	do := func(w int, n int64) (int, error) {
		i := next.Add(1) - 1
		if errs.Load() >= maxErrors || i >= int64(to) {
			return 0, loadgen.ErrStop
		}
		if keys[w] = i; f.cycle > 0 {
			keys[w] = i % int64(f.cycle)
		}
		status, err := send(w, n)
		if err != nil {
			status, err = send(w, n) // once more, on a fresh connection
		}
		if err != nil {
			errs.Add(1)
			mu.Lock()
			firstErr = cmpErr(firstErr, err)
			mu.Unlock()
			return 0, err
		}
		if statuses[w] == nil {
			statuses[w] = map[int]int{}
		}
		statuses[w][status]++
		return status, nil
	}
	loadgen.Closed(do, make([]loadgen.Counts, f.conns), time.Time{}, start.Add(floodLimit), nil)
	for _, m := range statuses {
		for s, n := range m {
			res.Statuses[s] += n
		}
	}
	res.Elapsed = time.Since(start)
	res.Errors = int(errs.Load())
	if res.Errors >= maxErrors {
		return res, fmt.Errorf("bench memory: flood stopped after %d transport errors, first: %w", res.Errors, firstErr)
	}
	return res, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
