//go:build wasip1

package plugin

import (
	"strconv"
	"unsafe"
)

// The proxy-wasm ABI's metric calls (proxy-wasm-cpp-host: a metric type,
// then its name; the id is written to the last argument).
//
//go:wasmimport env proxy_define_metric
func hostDefineMetric(metricType uint32, name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func hostIncrementMetric(id uint32, offset int64) uint32

const (
	metricCounter = 0
	metricGauge   = 1
)

// defineMetric defines a metric at configuration time; it panics, as the
// SDK does, when the host refuses (a name the host cannot take).
func defineMetric(metricType uint32, name string) uint32 {
	var id uint32
	if st := hostDefineMetric(metricType, unsafe.Pointer(unsafe.StringData(name)), uint32(len(name)), unsafe.Pointer(&id)); st != 0 {
		panic(Name + ": defining metric " + name + ": host status " + strconv.Itoa(int(st)))
	}
	return id
}

func defineCounter(name string) counter { return counter(defineMetric(metricCounter, name)) }

func defineGauge(name string) gauge { return gauge(defineMetric(metricGauge, name)) }

// Increment adds n to the counter. A status other than OK (the metric is
// unknown to the host) is ignored: a metric never fails a request.
func (c counter) Increment(n uint64) { hostIncrementMetric(uint32(c), int64(n)) }

// Add adds n to the gauge, as Increment.
func (g gauge) Add(n int64) { hostIncrementMetric(uint32(g), n) }
