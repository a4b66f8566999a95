// Package lint holds the repository's own style checks that gofmt and go vet
// do not make, as tests (make check runs them): imports grouped standard
// library, third party, this module, in that order, one blank line apart;
// and one fake host: the engine's tests run on internal/testing/fakehost,
// the host the host contract checks, with no second fake beside it.
package lint
