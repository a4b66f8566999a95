// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"strconv"
	"strings"

	"github.com/ratelimit-wasm/tokenbucket/internal/pngfont"
)

// A small bar-chart renderer: grouped bars with min–max whiskers, axis
// ticks and labels in the 5×7 font. Enough for the benchmark's plots
// without a plotting dependency.

// series is one set of bars, one value per category.
type series struct {
	Name   string
	Color  color.RGBA
	Values []spread
}

// chart is a grouped bar chart.
type chart struct {
	Title      string
	YLabel     string
	Categories []string // may contain '\n'
	Series     []series
	// Log makes the value axis logarithmic (decades), for figures that
	// span orders of magnitude such as latency percentiles.
	Log bool
}

var palette = []color.RGBA{
	{0x35, 0x6a, 0xb3, 0xff}, // blue
	{0xe0, 0x7b, 0x24, 0xff}, // orange
	{0x3b, 0x9a, 0x4c, 0xff}, // green
	{0x9c, 0x4d, 0xa3, 0xff}, // purple
}

var (
	black = color.RGBA{0x20, 0x20, 0x20, 0xff}
	grey  = color.RGBA{0xd8, 0xd8, 0xd8, 0xff}
	white = color.RGBA{0xff, 0xff, 0xff, 0xff}
)

type canvas struct{ img *image.RGBA }

func newCanvas(w, h int) *canvas {
	c := &canvas{img: image.NewRGBA(image.Rect(0, 0, w, h))}
	c.rect(0, 0, w, h, white)
	return c
}

func (c *canvas) rect(x0, y0, x1, y1 int, col color.RGBA) {
	if x0 > x1 {
		x0, x1 = x1, x0
	}
	if y0 > y1 {
		y0, y1 = y1, y0
	}
	r := image.Rect(x0, y0, x1, y1).Intersect(c.img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c.img.SetRGBA(x, y, col)
		}
	}
}

func (c *canvas) hline(x0, x1, y int, col color.RGBA) { c.rect(x0, y, x1+1, y+1, col) }
func (c *canvas) vline(x, y0, y1 int, col color.RGBA) { c.rect(x, y0, x+1, y1+1, col) }

// textWidth is the width of s at scale in pixels (6 columns per rune).
func textWidth(s string, scale int) int { return len([]rune(s)) * 6 * scale }

// text draws s with its top-left corner at (x, y).
func (c *canvas) text(x, y int, s string, scale int, col color.RGBA) {
	for _, r := range s {
		g := pngfont.Glyph(r)
		for row, line := range g {
			for colIdx, ch := range line {
				if ch == '#' {
					c.rect(x+colIdx*scale, y+row*scale, x+(colIdx+1)*scale, y+(row+1)*scale, col)
				}
			}
		}
		x += 6 * scale
	}
}

func (c *canvas) textCentered(cx, y int, s string, scale int, col color.RGBA) {
	c.text(cx-textWidth(s, scale)/2, y, s, scale, col)
}

// textVertical draws s bottom to top, its centre at (x, cy).
func (c *canvas) textVertical(x, cy int, s string, scale int, col color.RGBA) {
	w := textWidth(s, scale)
	tmp := newCanvas(w, 7*scale)
	tmp.text(0, 0, s, scale, col)
	for yy := 0; yy < 7*scale; yy++ {
		for xx := 0; xx < w; xx++ {
			if tmp.img.RGBAAt(xx, yy) == col {
				c.img.SetRGBA(x+yy, cy+w/2-xx, col)
			}
		}
	}
}

// niceStep returns a round tick step for a range of span with about n ticks.
func niceStep(span float64, n int) float64 {
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

func formatTick(v float64) string {
	switch {
	case v < 1 && v > 0:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case v >= 1e6 && math.Mod(v, 1e5) == 0:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3 && math.Mod(v, 100) == 0:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "K"
	default:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
}

func formatValue(v float64) string {
	switch {
	case v >= 1e4:
		return strconv.FormatFloat(math.Round(v/100)/10, 'f', -1, 64) + "K"
	case v >= 100:
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
}

// png renders the chart.
func (ch chart) png() ([]byte, error) {
	const (
		h                      = 560
		left, right, top, bott = 90, 20, 70, 110
	)
	// Room for category labels of up to 12 characters at scale 2.
	w := max(1000, left+right+len(ch.Categories)*(12*6*2+16))
	c := newCanvas(w, h)
	c.textCentered(w/2, 18, ch.Title, 2, black)
	plotW, plotH := w-left-right, h-top-bott
	ymin, ymax := math.Inf(1), 0.0
	for _, s := range ch.Series {
		for _, v := range s.Values {
			if v.N == 0 {
				continue
			}
			ymax = max(ymax, v.Max, v.Median)
			ymin = min(ymin, v.Min, v.Median)
		}
	}
	if ymax <= 0 {
		ymax = 1
	}
	var y func(v float64) int
	if ch.Log {
		lo := math.Floor(math.Log10(max(ymin, 1e-9)))
		hi := math.Ceil(math.Log10(ymax * 1.2))
		if hi <= lo {
			hi = lo + 1
		}
		y = func(v float64) int {
			f := (math.Log10(max(v, math.Pow(10, lo))) - lo) / (hi - lo)
			return top + plotH - int(math.Round(f*float64(plotH)))
		}
		for e := lo; e <= hi; e++ {
			v := math.Pow(10, e)
			yy := y(v)
			c.hline(left, left+plotW, yy, grey)
			lbl := formatTick(v)
			c.text(left-8-textWidth(lbl, 2), yy-7, lbl, 2, black)
		}
	} else {
		step := niceStep(ymax*1.08, 5)
		top2 := math.Ceil(ymax*1.08/step) * step
		y = func(v float64) int { return top + plotH - int(math.Round(v/top2*float64(plotH))) }
		for v := 0.0; v <= top2+step/2; v += step {
			yy := y(v)
			c.hline(left, left+plotW, yy, grey)
			lbl := formatTick(v)
			c.text(left-8-textWidth(lbl, 2), yy-7, lbl, 2, black)
		}
	}
	base := top + plotH
	c.vline(left, top, top+plotH, black)
	c.hline(left, left+plotW, top+plotH, black)
	c.textVertical(14, top+plotH/2, ch.YLabel, 2, black)

	n := len(ch.Categories)
	groupW := float64(plotW) / float64(max(n, 1))
	barW := groupW * 0.75 / float64(max(len(ch.Series), 1))
	for i, cat := range ch.Categories {
		gx := float64(left) + groupW*float64(i) + groupW*0.125
		for j, s := range ch.Series {
			if i >= len(s.Values) {
				continue
			}
			v := s.Values[i]
			x0 := int(gx + barW*float64(j))
			x1 := int(gx + barW*float64(j+1) - 3)
			if v.N == 0 {
				c.textCentered((x0+x1)/2, base-16, "N/A", 1, black)
				continue
			}
			c.rect(x0, y(v.Median), x1, base, s.Color)
			cx := (x0 + x1) / 2
			if v.Max > v.Min {
				c.vline(cx, y(v.Max), y(v.Min), black)
				c.hline(cx-4, cx+4, y(v.Max), black)
				c.hline(cx-4, cx+4, y(v.Min), black)
			}
			lbl := formatValue(v.Median)
			scale := 1
			if textWidth(lbl, 2) < x1-x0 {
				scale = 2
			}
			ly := min(y(v.Max), y(v.Median)) - 8*scale - 4
			c.textCentered(cx, ly, lbl, scale, black)
		}
		for k, line := range strings.Split(cat, "\n") {
			c.textCentered(int(float64(left)+groupW*(float64(i)+0.5)), top+plotH+10+k*18, line, 2, black)
		}
	}
	if len(ch.Series) > 1 {
		x := left + 10
		for _, s := range ch.Series {
			c.rect(x, 46, x+14, 60, s.Color)
			c.text(x+20, 47, s.Name, 2, black)
			x += 20 + textWidth(s.Name, 2) + 30
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, c.img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
