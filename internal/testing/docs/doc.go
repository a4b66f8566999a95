// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package docs holds tests of the repository's Markdown as a whole: every
// relative link of every tracked Markdown file reaches a file or directory
// of the repository, and every #anchor one of the headings (or explicit
// anchors) of its target, named as GitHub names them; and the metric list
// of docs/responses.md is exactly the metrics the plugin defines; and
// user-facing Markdown (README.md, CHANGELOG.md, docs/, the examples'
// READMEs) names no issue number and no numbered benchmark configuration;
// and the documentation as a whole stays within a word budget
// (maxDocWords). It has no code of its own.
package docs
