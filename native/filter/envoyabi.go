//go:build cgo

package filter

/*
#cgo darwin LDFLAGS: -Wl,-undefined,dynamic_lookup
#cgo linux LDFLAGS: -Wl,--unresolved-symbols=ignore-all
#include <stddef.h>
#include <stdint.h>

// Envoy 1.40's config-level metric calls (source/extensions/dynamic_modules
// abi.h; exported by the official binary), which the SDK snapshot's abi.h
// does not declare. tb_module_buffer is envoy_dynamic_module_type_module_buffer;
// the int result is envoy_dynamic_module_type_metrics_result.
typedef struct {
  const char* ptr;
  size_t length;
} tb_module_buffer;

int envoy_dynamic_module_callback_http_filter_config_increment_counter(
    void* config_envoy_ptr, size_t id, tb_module_buffer* label_values, size_t label_values_length,
    uint64_t value);
int envoy_dynamic_module_callback_http_filter_config_increment_gauge(
    void* config_envoy_ptr, size_t id, tb_module_buffer* label_values, size_t label_values_length,
    uint64_t value);
int envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
    void* config_envoy_ptr, size_t id, tb_module_buffer* label_values, size_t label_values_length,
    uint64_t value);

// In the SDK snapshot's abi.h, not wrapped by its Go package.
uint32_t envoy_dynamic_module_callback_http_filter_get_worker_index(void* filter_envoy_ptr);
*/
import "C"

import (
	"unsafe"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
)

// envoyMetrics changes one configuration's metrics through Envoy's
// config-level calls: Envoy's counters and gauges are atomic, so any thread
// may call them (a worker inside a filter callback, the main thread in the
// answer of a call or the tick) and nothing waits for a request.
type envoyMetrics struct{ config unsafe.Pointer }

// newEnvoyMetrics returns the metrics of the configuration behind handle.
func newEnvoyMetrics(handle shared.HttpFilterConfigHandle) (sink, error) {
	p, err := envoyPtr(handle, sdkABIPackage, sdkConfigHandleType, sdkConfigHandleField)
	if err != nil {
		return nil, err
	}
	return envoyMetrics{config: p}, nil
}

func (m envoyMetrics) incrementCounter(id shared.MetricID, n uint64) {
	C.envoy_dynamic_module_callback_http_filter_config_increment_counter(m.config, C.size_t(id), nil, 0, C.uint64_t(n))
}

func (m envoyMetrics) incrementGauge(id shared.MetricID, n uint64) {
	C.envoy_dynamic_module_callback_http_filter_config_increment_gauge(m.config, C.size_t(id), nil, 0, C.uint64_t(n))
}

func (m envoyMetrics) decrementGauge(id shared.MetricID, n uint64) {
	C.envoy_dynamic_module_callback_http_filter_config_decrement_gauge(m.config, C.size_t(id), nil, 0, C.uint64_t(n))
}

// workerIndex is the index of the Envoy worker running the filter behind
// handle (0 to --concurrency − 1), or false when handle is not the SDK's
// filter handle envoyPtr can read.
func workerIndex(handle shared.HttpFilterHandle) (int, bool) {
	p, ok := filterPtr(handle)
	if !ok {
		return 0, false
	}
	return int(C.envoy_dynamic_module_callback_http_filter_get_worker_index(p)), true
}
