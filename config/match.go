package config

import (
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
	"github.com/ratelimit-wasm/tokenbucket/internal/jsonlimit"
)

// checkRegexes bounds what the regexes of a configuration may cost a
// request: each regex condition sees at most Condition.RegexMaxInput bytes
// of a value (RegexBudget NFA steps), and there are at most
// MaxRegexConditions of them.
func checkRegexes(rules []Rule) error {
	n := 0
	for i := range rules {
		for j := range rules[i].Match {
			if rules[i].Match[j].Regex == nil {
				continue
			}
			if n++; n > MaxRegexConditions {
				return errorf(jsonlimit.Join(jsonfield.Elem("rules", i)+".match", rules[i].Match[j].Source.String())+".regex", "at most "+strconv.Itoa(MaxRegexConditions)+" regex conditions in a configuration (each costs a request up to "+strconv.Itoa(RegexBudget)+" steps)")
			}
		}
	}
	return nil
}

var operators = []string{"present", "equals", "in", "prefix", "regex"}

func parseMatch(path string, v gjson.Result) ([]Condition, error) {
	ms, err := members(path, v)
	if err != nil {
		return nil, err
	}
	var conds []Condition
	seen := make(map[Source]bool)
	for _, m := range ms {
		p := m.at
		src, err := parseSource(m.key)
		if err != nil {
			return nil, &Error{Path: p, Err: err}
		}
		if seen[src] {
			return nil, errorf(p, "a second condition on "+strconv.Quote(src.String()))
		}
		seen[src] = true
		ops, err := members(p, m.value)
		if err != nil {
			return nil, err
		}
		if len(ops) == 0 {
			return nil, errorf(p, "needs at least one of present, equals, in, prefix, regex")
		}
		c := Condition{Source: src}
		for _, op := range ops {
			if !slices.Contains(operators, op.key) {
				return nil, errorf(op.at, "unknown operator (want present, equals, in, prefix or regex)")
			}
		}
		o := object{path: p, fields: make(map[string]gjson.Result)}
		for _, op := range ops {
			o.fields[op.key] = op.value
			o.order = append(o.order, op.key)
		}
		if v, ok := o.get("present"); ok {
			b, err := boolean(p+".present", v)
			if err != nil {
				return nil, err
			}
			c.Present = &b
		}
		if c.Equals, err = o.optString("equals"); err != nil {
			return nil, err
		}
		if v, ok := o.get("in"); ok {
			in, err := array(p+".in", v)
			if err != nil {
				return nil, err
			}
			for i, e := range in {
				s, err := str(jsonfield.Elem(p+".in", i), e)
				if err != nil {
					return nil, err
				}
				c.In = append(c.In, s)
			}
			if len(c.In) == 0 {
				return nil, errorf(p+".in", "must hold at least one value")
			}
		}
		if c.Prefix, err = o.optString("prefix"); err != nil {
			return nil, err
		}
		re, err := o.optString("regex")
		if err != nil {
			return nil, err
		}
		if re != nil {
			if c.Regex, err = regexp.Compile(*re); err != nil {
				return nil, &Error{Path: p + ".regex", Err: err}
			}
			insts, err := regexInstructions(*re)
			if err != nil {
				return nil, &Error{Path: p + ".regex", Err: err}
			}
			if insts > MaxRegexInstructions {
				return nil, errorf(p+".regex", "compiles to "+strconv.Itoa(insts)+" instructions, more than "+strconv.Itoa(MaxRegexInstructions)+": it could read only "+strconv.Itoa(RegexBudget/insts)+" bytes of a value (see RegexBudget); use a shorter pattern or a prefix/in condition")
			}
			c.RegexMaxInput = min(MaxRegexInput, RegexBudget/insts)
		}
		if c.Present != nil && !*c.Present && len(ops) > 1 {
			return nil, errorf(p+".present", "false cannot be combined with equals, in, prefix or regex")
		}
		conds = append(conds, c)
	}
	return conds, nil
}

// regexInstructions is the size of the program Go's regexp runs for re.
func regexInstructions(re string) (int, error) {
	tree, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return 0, err
	}
	prog, err := syntax.Compile(tree.Simplify())
	if err != nil {
		return 0, err
	}
	return len(prog.Inst), nil
}
