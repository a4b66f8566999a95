// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// series is one set of bars, one value per category.
type series struct {
	Name   string
	Color  color.RGBA
	Values []spread
}

// chart is a grouped bar chart with min–max whiskers, drawn by gonum/plot.
type chart struct {
	Title      string
	YLabel     string
	Categories []string // may contain '\n'
	Series     []series
	// Log makes the value axis logarithmic, for figures that span orders of
	// magnitude such as latency percentiles.
	Log bool
}

var palette = []color.RGBA{
	{0x35, 0x6a, 0xb3, 0xff}, // blue
	{0xe0, 0x7b, 0x24, 0xff}, // orange
	{0x3b, 0x9a, 0x4c, 0xff}, // green
	{0x9c, 0x4d, 0xa3, 0xff}, // purple
}

// bars is one series as a gonum plotter: bar j of category i is centred at
// x = i + offset (data units), whiskers from Min to Max. gonum's BarChart
// offsets bars in canvas units, which its error bars cannot follow.
type bars struct {
	s             series
	offset, width float64
	floor         float64 // the bars' base: 0, or the log axis' minimum
}

// Plot implements plot.Plotter.
func (b bars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	line := draw.LineStyle{Color: color.Black, Width: vg.Points(1)}
	for i, v := range b.s.Values {
		if v.N == 0 {
			continue
		}
		x0, x1 := trX(float64(i)+b.offset-b.width/2), trX(float64(i)+b.offset+b.width/2)
		y0, y1 := trY(max(b.floor, p.Y.Min)), trY(v.Median)
		c.FillPolygon(b.s.Color, []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}})
		if v.N > 1 {
			xm, lo, hi := (x0+x1)/2, trY(v.Min), trY(v.Max)
			c.StrokeLine2(line, xm, lo, xm, hi)
			c.StrokeLine2(line, xm-2, lo, xm+2, lo)
			c.StrokeLine2(line, xm-2, hi, xm+2, hi)
		}
	}
}

// DataRange implements plot.DataRanger.
func (b bars) DataRange() (xmin, xmax, ymin, ymax float64) {
	ymin, ymax = math.Inf(1), math.Inf(-1)
	for _, v := range b.s.Values {
		if v.N > 0 {
			ymin, ymax = min(ymin, v.Min, v.Median), max(ymax, v.Max, v.Median)
		}
	}
	if ymax < ymin {
		ymin, ymax = 1, 1
	}
	if b.floor == 0 {
		ymin = 0
	}
	return -0.5, float64(len(b.s.Values)) - 0.5, ymin, ymax * 1.05
}

// Thumbnail implements plot.Thumbnailer (the legend's swatch).
func (b bars) Thumbnail(c *draw.Canvas) {
	r := c.Rectangle
	c.FillPolygon(b.s.Color, []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}})
}

// png renders the chart.
func (ch chart) png() ([]byte, error) {
	p := plot.New()
	p.Title.Text = ch.Title
	p.Title.TextStyle.Font.Size = vg.Points(16)
	p.Y.Label.Text = ch.YLabel
	p.NominalX(ch.Categories...)
	p.Legend.Top = true
	p.Y.Tick.Marker = plot.DefaultTicks{}
	floor := 0.0
	if ch.Log {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		floor = math.Inf(1)
		for _, s := range ch.Series {
			for _, v := range s.Values {
				if v.N > 0 && min(v.Min, v.Median) > 0 {
					floor = min(floor, v.Min, v.Median)
				}
			}
		}
		if math.IsInf(floor, 1) {
			floor = 1
		}
		floor = math.Pow(10, math.Floor(math.Log10(floor)))
	}
	p.Add(plotter.NewGrid())
	width := 0.8 / float64(max(1, len(ch.Series)))
	for j, s := range ch.Series {
		b := bars{s: s, offset: (float64(j) - float64(len(ch.Series)-1)/2) * width, width: width * 0.9, floor: floor}
		p.Add(b)
		p.Legend.Add(s.Name, b)
	}
	p.X.Min, p.X.Max = -0.5, float64(len(ch.Categories))-0.5
	if ch.Log {
		p.Y.Min = floor
	}
	w := vg.Length(max(1000, 90+len(ch.Categories)*160)) * vg.Inch / 96
	wt, err := p.WriterTo(w, 560*vg.Inch/96, "png")
	if err != nil {
		return nil, fmt.Errorf("bench: plot: %w", err)
	}
	var buf bytes.Buffer
	_, err = wt.WriteTo(&buf)
	return buf.Bytes(), err
}
