// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package service

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// redisInfo returns the numeric fields of INFO section (name: value), and
// of each "k=v,..." field as name.k.
func redisInfo(b *testing.B, c *redis.Client, section string) map[string]float64 {
	b.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[k] = f
			continue
		}
		for _, kv := range strings.Split(v, ",") {
			name, val, _ := strings.Cut(kv, "=")
			if f, err := strconv.ParseFloat(val, 64); err == nil {
				out[k+"."+name] = f
			}
		}
	}
	return out
}

// redisCost is Redis's own CPU time so far (INFO cpu: user + system), and
// the time it spent running scripts (INFO commandstats: EVALSHA's and
// EVAL's usec).
func redisCost(b *testing.B, c *redis.Client) (cpu, scripts time.Duration) {
	b.Helper()
	cpuInfo, stats := redisInfo(b, c, "cpu"), redisInfo(b, c, "commandstats")
	cpu = time.Duration((cpuInfo["used_cpu_sys"] + cpuInfo["used_cpu_user"]) * float64(time.Second))
	scripts = time.Duration(stats["cmdstat_evalsha.usec"]+stats["cmdstat_eval.usec"]) * time.Microsecond
	return cpu, scripts
}

// BenchmarkRedisDecideCPU: what a decision costs Redis, against a real
// redis-server, from 16 goroutines over 32 buckets, unbatched and batched
// (--batch-max 64): Redis's CPU per decision (redis-µs/op, INFO cpu), the
// time its scripts ran per decision (script-µs/op, INFO commandstats), and
// the decisions per pipeline (per-batch), beside its time and allocations
// per decision. On a loaded machine only the
// ratio of two sub-benchmarks of one run means anything.
func BenchmarkRedisDecideCPU(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, PoolSize: 64})
	defer c.Close()
	for _, batch := range []int{0, 64} {
		b.Run("batch"+strconv.Itoa(batch), func(b *testing.B) {
			s, err := NewRedisStore(c, RedisOptions{Batch: BatchOptions{MaxSize: batch}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var pipelines, calls atomic.Int64
			if s.batch != nil {
				s.batch.onBatch = func(n int) { pipelines.Add(1); calls.Add(int64(n)) }
			}
			b.SetParallelism(16)
			b.ReportAllocs()
			var next atomic.Int64
			cpu0, scripts0 := redisCost(b, c)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := one("cpu-"+strconv.FormatInt(next.Add(1)%32, 10), 1e6, 1e6, 1)
				for pb.Next() {
					if _, err := s.Decide(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			cpu1, scripts1 := redisCost(b, c)
			b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/float64(b.N), "redis-µs/op")
			b.ReportMetric(float64(scripts1-scripts0)/float64(time.Microsecond)/float64(b.N), "script-µs/op")
			if p := pipelines.Load(); p > 0 {
				b.ReportMetric(float64(calls.Load())/float64(p), "per-batch")
			}
		})
	}
}
