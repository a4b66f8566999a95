// Package version is the version of this build of the plugin, the native
// module and limitd: "dev" unless the build stamps another. `make release`
// stamps the release's version with the linker,
//
//	go build -ldflags='-X github.com/ratelimit-wasm/tokenbucket/internal/version.Version=v0.3.0'
//
// (the Makefile's BUILD_VERSION). A stamp is a constant string, so a
// stamped build is as reproducible as an unstamped one: the same sources and
// version give the same bytes.
package version

// Version is the build's version, "dev" when not stamped.
var Version = "dev"
