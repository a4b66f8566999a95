// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// seriesColors are the results' colors, in order.
var seriesColors = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0xd6, 0x27, 0x28, 0xff}, // red
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0x94, 0x67, 0xbd, 0xff}, // purple
}

// memoryPlot draws, for each result, the growth of Envoy's RSS over its
// baseline (solid) and of its allocator's bytes in use (dashed) against
// distinct keys (log scale). Growth rather than the absolute RSS, because
// the baselines differ with the plugins' code size.
func memoryPlot(results []result) (*plot.Plot, error) {
	if len(results) == 0 || len(results) > len(seriesColors) {
		return nil, fmt.Errorf("benchmemory: plot: want 1..%d results, got %d", len(seriesColors), len(results))
	}
	p := plot.New()
	p.Title.Text = "Envoy memory growth against distinct client keys"
	p.X.Label.Text = "distinct keys"
	p.Y.Label.Text = "growth since the warm-up (MiB)"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	for i, r := range results {
		var rss, alloc plotter.XYs
		for _, smp := range r.samples {
			x := float64(smp.keys)
			if x <= 0 {
				return nil, fmt.Errorf("benchmemory: plot: %s: %v keys cannot be drawn on a log scale", r.title, x)
			}
			rss = append(rss, plotter.XY{X: x, Y: diffMiB(smp.rss, r.baseline)})
			alloc = append(alloc, plotter.XY{X: x, Y: diffMiB(smp.alloc, r.allocBaseline)})
		}
		for _, s := range []struct {
			name   string
			xys    plotter.XYs
			dashed bool
		}{{r.title + ": RSS", rss, false}, {r.title + ": allocated", alloc, true}} {
			l, pts, err := plotter.NewLinePoints(s.xys)
			if err != nil {
				return nil, fmt.Errorf("benchmemory: plot: %s: %w", s.name, err)
			}
			l.Color, pts.Color, l.Width = seriesColors[i], seriesColors[i], vg.Points(2)
			if s.dashed {
				l.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
			}
			p.Add(l, pts)
			p.Legend.Add(s.name, l, pts)
		}
	}
	p.Y.Min = min(0, p.Y.Min)
	return p, nil
}

// writePlot writes memoryPlot's PNG to path.
func writePlot(path string, results []result) error {
	p, err := memoryPlot(results)
	if err != nil {
		return err
	}
	return p.Save(960*vg.Inch/96, 560*vg.Inch/96, path)
}
