// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// The front page (README.md) carries one sentence of the benchmark's
// figures, between these markers; a full run or -render rewrites it, and
// TestCommittedPagesAreGenerated fails when it was typed by hand.
const (
	frontBegin = "<!-- cost: written by `make bench` (cmd/bench) from docs/benchmarks/results.json; do not edit -->"
	frontEnd   = "<!-- end of cost -->"
)

// frontCost is the front page's cost sentence: one ratio (requests per
// Envoy core with the plugin's local rule against no filter) and one memory
// figure (what the plugin adds to Envoy's resident memory with one worker).
func (r *report) frontCost() (string, error) {
	none, plugin := r.result(1), r.result(3)
	if none == nil || plugin == nil || plugin.CapVs1.N == 0 || none.RSSMiB.N == 0 || plugin.RSSMiB.N == 0 {
		return "", errors.New("bench: the report lacks no filter or the plugin's local rule: no cost sentence")
	}
	day, _, _ := strings.Cut(r.Info.Date, " ")
	return fmt.Sprintf("**What it costs:** with a local rule, one Envoy core serves %.2f times the requests it serves "+
		"with no filter, and Envoy's memory grows by %.0f MiB (one worker; measured by `make bench` on %s: "+
		"[benchmarks](docs/benchmarks/README.md)).",
		plugin.CapVs1.Median, plugin.RSSMiB.Median-none.RSSMiB.Median, day), nil
}

// replaceFront returns doc with the text between frontBegin and frontEnd
// (each on a line of its own, once, in that order) replaced by sentence.
func replaceFront(doc, sentence string) (string, error) {
	if strings.Count(doc, frontBegin) > 1 || strings.Count(doc, frontEnd) > 1 {
		return "", errors.New("bench: the cost markers appear more than once")
	}
	before, rest, ok := strings.Cut(doc, frontBegin+"\n")
	if !ok {
		return "", fmt.Errorf("bench: no line %q", frontBegin)
	}
	_, after, ok := strings.Cut(rest, frontEnd+"\n")
	if !ok {
		return "", fmt.Errorf("bench: no line %q after %q", frontEnd, frontBegin)
	}
	return before + frontBegin + "\n" + sentence + "\n" + frontEnd + "\n" + after, nil
}

// writeFront rewrites the cost sentence of the front page at path.
func (r *report) writeFront(path string) error {
	sentence, err := r.frontCost()
	if err != nil {
		return err
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := replaceFront(string(doc), sentence)
	if err != nil {
		return fmt.Errorf("%w in %s", err, path)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
