//go:build cgo

package filter

/*
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

// The file this code was loaded from: the module's .so.
static const char* tb_module_path(void) {
  Dl_info info;
  if (dladdr((void*)tb_module_path, &info) == 0) return NULL;
  return info.dli_fname;
}

// Whether the process (Envoy and what it loaded) defines name.
static int tb_has_symbol(const char* name) {
  return dlsym(RTLD_DEFAULT, name) != NULL;
}
*/
import "C"

import "unsafe"

// modulePath is the module's file as the dynamic linker loaded it, or "".
func modulePath() string {
	p := C.tb_module_path()
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// processHasSymbol reports whether the process defines name.
func processHasSymbol(name string) bool {
	c := C.CString(name)
	defer C.free(unsafe.Pointer(c))
	return C.tb_has_symbol(c) != 0
}
