package engine

import (
	"errors"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

// Configuration is a parsed and checked configuration, ready for NewPlugin:
// a host parses each configuration it is given once and builds its Plugins
// (one per worker, a new one after a failure) from it. It is immutable and
// safe for concurrent use.
type Configuration struct{ cfg *config.Config }

// Parse parses and checks a configuration for a host that can do what o
// says (config.Parse is the only validator; Options.FlatMetadata refuses
// what such a host would read wrong). A configuration the plugin refuses is
// a *RefusalError, whose text is the line the host should log.
func Parse(data []byte, o Options) (*Configuration, error) {
	cfg, err := config.Parse(data)
	if err == nil && o.FlatMetadata {
		err = checkFlatMetadata(cfg)
	}
	if err == nil {
		err = checkClusterSlots(cfg)
	}
	if err != nil {
		return nil, &RefusalError{Err: err}
	}
	return &Configuration{cfg: cfg}, nil
}

// CheckConfiguration returns the *RefusalError OnPluginStart logs for data
// as the plugin's configuration, or nil when the plugin would start with
// it. It needs no host, so a command can check a configuration without
// Envoy (cmd/checkconfig).
func CheckConfiguration(data []byte) error {
	_, err := Parse(data, Options{})
	return err
}

// ReadsResponseBody reports whether a Request may read a response body
// under c: only a cost taken from the response's JSON does
// (Request.OnResponseBody and OnResponseTrailers do nothing otherwise), so
// without one a host may hand the engine no body callback and ask the
// proxy nothing about the body.
func (c *Configuration) ReadsResponseBody() bool {
	for i := range c.cfg.Rules {
		if c.cfg.Rules[i].Cost.Source.Kind == config.SourceResponseJSON {
			return true
		}
	}
	return false
}

// checkFlatMetadata refuses, on a host with Options.FlatMetadata, a jwt:
// source (a limit key or a match condition; config refuses one as a cost)
// read from the claims jwt_authn verified; with trust_unverified_jwt
// the engine reads the bearer token's payload instead (the one jwt_authn
// verified when it reads the token from the Authorization header).
func checkFlatMetadata(cfg *config.Config) error {
	if cfg.TrustUnverifiedJWT {
		return nil
	}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		at := "rules[" + strconv.Itoa(i) + "]"
		for j, k := range r.LimitKeys {
			if k.Kind == config.SourceJWT {
				return flatMetadataRefusal(at + ".limit_keys[" + strconv.Itoa(j) + "]")
			}
		}
		for _, c := range r.Match {
			if c.Source.Kind == config.SourceJWT {
				return flatMetadataRefusal(at + ".match[" + strconv.Quote("jwt:"+c.Source.Name) + "]")
			}
		}
	}
	return nil
}

func flatMetadataRefusal(path string) error {
	return errors.New("config: " + path + ": the native module cannot read the claims " +
		"jwt_authn verified (Envoy's dynamic-module SDK reads no nested metadata): set trust_unverified_jwt " +
		"with jwt_authn in front requiring the token from the Authorization header and forward: true, or use the Wasm plugin")
}
