package filter

import (
	"errors"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// checkHost refuses what this host cannot do as the Wasm plugin does, so
// that nothing differs silently. Envoy's dynamic-module SDK reads dynamic
// metadata one level deep (namespace, key) and only as a string, number or
// bool, so it cannot read the claims jwt_authn writes as a structure under
// payload_in_metadata: a jwt: source needs trust_unverified_jwt, with
// which the module reads the bearer token's payload (the one jwt_authn
// verified when it reads the token from the Authorization header).
// cfg has passed engine.New already.
func checkHost(cfg *config.Config) error {
	if cfg.TrustUnverifiedJWT {
		return nil
	}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		at := "rules[" + strconv.Itoa(i) + "]"
		for j, k := range r.LimitKeys {
			if k.Kind == config.SourceJWT {
				return jwtRefusal(at + ".limit_keys[" + strconv.Itoa(j) + "]")
			}
		}
		for _, c := range r.Match {
			if c.Source.Kind == config.SourceJWT {
				return jwtRefusal(at + ".match[" + strconv.Quote("jwt:"+c.Source.Name) + "]")
			}
		}
		if r.Cost.Source.Kind == config.SourceJWT {
			return jwtRefusal(at + ".algorithm_config.cost_source")
		}
	}
	return nil
}

func jwtRefusal(path string) error {
	return &engine.RefusalError{Err: errors.New("config: " + path + ": the native module cannot read the claims " +
		"jwt_authn verified (Envoy's dynamic-module SDK reads no nested metadata): set trust_unverified_jwt " +
		"with jwt_authn in front requiring the token from the Authorization header and forward: true, or use the Wasm plugin")}
}

// readsBody reports whether the engine may read a response body under cfg:
// only a cost taken from the response's JSON does (engine.Request's
// OnResponseBody and OnResponseTrailers do nothing otherwise), so without
// one the filter hands no body callback to the engine and asks Envoy
// nothing about the body.
func readsBody(cfg *config.Config) bool {
	for i := range cfg.Rules {
		if cfg.Rules[i].Cost.Source.Kind == config.SourceResponseJSON {
			return true
		}
	}
	return false
}
