package pngfont

import (
	"strings"
	"testing"
)

func TestGlyphShapes(t *testing.T) {
	for r, g := range glyphs {
		for i, row := range g {
			if len(row) != W || strings.Trim(row, "#.") != "" {
				t.Errorf("glyph %q row %d = %q: want %d of '#' and '.'", r, i, row, W)
			}
		}
	}
	if Glyph('a') != Glyph('A') || Glyph('\u2603') != Glyph('?') || Has('\u2603') || !Has('µ') {
		t.Error("lower case, fallback or Has is wrong")
	}
}
