//go:build !wasip1

package plugin

import "github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

func defineCounter(name string) counter { return counter(proxywasm.DefineCounterMetric(name)) }

func defineGauge(name string) gauge { return gauge(proxywasm.DefineGaugeMetric(name)) }

// Increment adds n to the counter.
func (c counter) Increment(n uint64) { proxywasm.MetricCounter(c).Increment(n) }

// Add adds n to the gauge.
func (g gauge) Add(n int64) { proxywasm.MetricGauge(g).Add(n) }
