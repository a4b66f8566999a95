//go:build !benchfloor

package service

import _ "embed"

// takeLua is take.lua, the plain decision's own path.
//
//go:embed take.lua
var takeLua string
