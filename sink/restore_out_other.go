//go:build !unix

package sink

// oNoFollow is not available here; O_EXCL alone already refuses an existing
// entry, links included.
const oNoFollow = 0
