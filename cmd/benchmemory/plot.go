// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/internal/pngfont"
)

// The plot's geometry, in image pixels.
const (
	plotW, plotH = 960, 560
	marginLeft   = 100
	marginRight  = 40
	marginTop    = 70
	marginBottom = 80
	textScale    = 2 // image pixels per font pixel
	lineWidth    = 3
	markerSize   = 9
	dashLen      = 8
	maxSeries    = 8 // the legend's room
)

var (
	white     = color.RGBA{0xff, 0xff, 0xff, 0xff}
	black     = color.RGBA{0x20, 0x20, 0x20, 0xff}
	gridColor = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	// seriesColors are the lines' colors, in the order of the results.
	seriesColors = []color.RGBA{
		{0x1f, 0x77, 0xb4, 0xff}, // blue
		{0xd6, 0x27, 0x28, 0xff}, // red
		{0x2c, 0xa0, 0x2c, 0xff}, // green
		{0x94, 0x67, 0xbd, 0xff}, // purple
	}
)

// series is one line of the plot.
type series struct {
	label  string
	x, y   []float64 // x > 0 (log scale)
	color  int       // index in seriesColors
	dashed bool
}

// writePlot draws, for each result, the growth of Envoy's RSS over its
// baseline (solid) and of its allocator's bytes in use (dashed) against
// distinct keys (log scale), and writes the PNG to path. Growth rather than
// the absolute RSS, because the baselines differ with the plugins' code size.
func writePlot(path string, results []result) error {
	var ss []series
	for i, r := range results {
		rss := series{label: r.title + ": RSS", color: i}
		alloc := series{label: r.title + ": allocated", color: i, dashed: true}
		for _, smp := range r.samples {
			rss.x = append(rss.x, float64(smp.keys))
			rss.y = append(rss.y, diffMiB(smp.rss, r.baseline))
			alloc.x = append(alloc.x, float64(smp.keys))
			alloc.y = append(alloc.y, diffMiB(smp.alloc, r.allocBaseline))
		}
		ss = append(ss, rss, alloc)
	}
	img, err := drawPlot("ENVOY MEMORY GROWTH AGAINST DISTINCT CLIENT KEYS", "DISTINCT KEYS",
		"GROWTH SINCE THE WARM-UP (MIB)", ss)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// drawPlot draws ss with a log-scale x axis (whole decades) and a linear y
// axis (nice steps around the data, from 0 when the data are positive).
func drawPlot(title, xLabel, yLabel string, ss []series) (*image.RGBA, error) {
	if len(ss) == 0 || len(ss) > maxSeries {
		return nil, fmt.Errorf("benchmemory: plot: want 1..%d series, got %d", maxSeries, len(ss))
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for i, s := range ss {
		if s.color < 0 || s.color >= len(seriesColors) {
			return nil, fmt.Errorf("benchmemory: plot: series %d: color %d out of 0..%d", i, s.color, len(seriesColors)-1)
		}
		if len(s.x) == 0 || len(s.x) != len(s.y) {
			return nil, fmt.Errorf("benchmemory: plot: series %d: %d x and %d y values", i, len(s.x), len(s.y))
		}
		for j := range s.x {
			if !(s.x[j] > 0) || math.IsInf(s.x[j], 0) || math.IsNaN(s.y[j]) || math.IsInf(s.y[j], 0) {
				return nil, fmt.Errorf("benchmemory: plot: series %d: point %d (%v, %v) cannot be drawn", i, j, s.x[j], s.y[j])
			}
			xmin, xmax = math.Min(xmin, s.x[j]), math.Max(xmax, s.x[j])
			ymin, ymax = math.Min(ymin, s.y[j]), math.Max(ymax, s.y[j])
		}
	}
	// Whole decades on x.
	d0, d1 := math.Floor(math.Log10(xmin)), math.Ceil(math.Log10(xmax))
	if d1 == d0 {
		d1++
	}
	// Nice steps on y, with a little room above and below.
	step := niceStep((ymax - ymin) / 5)
	y0 := math.Floor(ymin/step)*step - step
	y1 := math.Ceil(ymax/step)*step + step
	if ymin >= 0 {
		y0 = 0
	}

	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	fill(img, img.Bounds(), white)
	left, right := marginLeft, plotW-marginRight
	top, bottom := marginTop, plotH-marginBottom
	px := func(x float64) int {
		return left + int(math.Round((math.Log10(x)-d0)/(d1-d0)*float64(right-left)))
	}
	py := func(y float64) int {
		return bottom - int(math.Round((y-y0)/(y1-y0)*float64(bottom-top)))
	}

	// Grid and tick labels.
	for d := d0; d <= d1; d++ {
		for m := 1.0; m < 10; m++ {
			x := m * math.Pow(10, d)
			if d == d1 && m > 1 {
				break
			}
			c := gridColor
			if m == 1 {
				label := humanCount(x)
				drawText(img, px(x)-textWidth(label)/2, bottom+12, label, black)
			} else {
				c = color.RGBA{0xf0, 0xf0, 0xf0, 0xff}
			}
			fill(img, image.Rect(px(x), top, px(x)+1, bottom), c)
		}
	}
	decimals := max(0, int(-math.Floor(math.Log10(step))))
	for k := 0; y0+float64(k)*step <= y1+step/2; k++ {
		y := y0 + float64(k)*step
		fill(img, image.Rect(left, py(y), right, py(y)+1), gridColor)
		label := strconv.FormatFloat(y, 'f', decimals, 64)
		drawText(img, left-10-textWidth(label), py(y)-pngfont.H*textScale/2, label, black)
	}
	// Axes, labels and title.
	fill(img, image.Rect(left, top, left+2, bottom+1), black)
	fill(img, image.Rect(left, bottom, right, bottom+2), black)
	drawText(img, (left+right-textWidth(xLabel))/2, bottom+44, xLabel, black)
	drawText(img, 8, top-28, yLabel, black)
	drawText(img, (plotW-textWidth(title))/2, 16, title, black)

	// Lines, markers and the legend.
	for i, s := range ss {
		c := seriesColors[s.color]
		dash := 0
		if s.dashed {
			dash = dashLen
		}
		for j := 1; j < len(s.x); j++ {
			drawLine(img, px(s.x[j-1]), py(s.y[j-1]), px(s.x[j]), py(s.y[j]), lineWidth, dash, c)
		}
		m := markerSize
		if s.dashed {
			m = markerSize * 2 / 3
		}
		for j := range s.x {
			x, y := px(s.x[j]), py(s.y[j])
			fill(img, image.Rect(x-m/2, y-m/2, x+m/2+1, y+m/2+1), c)
		}
		ly := top + 14 + i*26
		drawLine(img, left+16, ly+6, left+46, ly+6, lineWidth, dash, c)
		drawText(img, left+56, ly, s.label, black)
	}
	return img, nil
}

// niceStep returns 1, 2 or 5 times a power of ten, at least raw.
func niceStep(raw float64) float64 {
	if !(raw > 0) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// humanCount writes 1000 as 1K and 1000000 as 1M.
func humanCount(x float64) string {
	switch {
	case x >= 1e6:
		return strconv.FormatFloat(x/1e6, 'f', -1, 64) + "M"
	case x >= 1e3:
		return strconv.FormatFloat(x/1e3, 'f', -1, 64) + "K"
	}
	return strconv.FormatFloat(x, 'f', -1, 64)
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// drawLine draws a line of width w from (x0, y0) to (x1, y1) (Bresenham,
// with a square brush); with dash > 0 it draws dash steps, skips dash, and
// so on.
func drawLine(img *image.RGBA, x0, y0, x1, y1, w, dash int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for step := 0; ; step++ {
		if dash == 0 || (step/dash)%2 == 0 {
			fill(img, image.Rect(x0-w/2, y0-w/2, x0-w/2+w, y0-w/2+w), c)
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// textWidth is the width of s drawn by drawText.
func textWidth(s string) int {
	n := len([]rune(s))
	if n == 0 {
		return 0
	}
	return (n*(pngfont.W+1) - 1) * textScale
}

// drawText draws s with its top-left corner at (x, y).
func drawText(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range s {
		g := pngfont.Glyph(r)
		for row := 0; row < pngfont.H; row++ {
			for col := 0; col < pngfont.W; col++ {
				if g[row][col] == '#' {
					fill(img, image.Rect(x+col*textScale, y+row*textScale, x+(col+1)*textScale, y+(row+1)*textScale), c)
				}
			}
		}
		x += (pngfont.W + 1) * textScale
	}
}
