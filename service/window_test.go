package service

import "context"

// Count implements Store.
func (f failingStore) Count(context.Context, *CountRequest) (CountAnswer, error) {
	return CountAnswer{}, f.err
}
