package meta

// SetBeforeFirstChunk makes f run before a finalizer writes a cell's first
// chunk, until the returned func is called.
func SetBeforeFirstChunk(f func()) (restore func()) {
	beforeFirstChunk = f
	return func() { beforeFirstChunk = nil }
}
