package pipeline

import (
	"time"
)

// Commit age and gc (docs/FORMAT.md, "Commit protocol", "Commit age").
//
// consumer gc deletes unreferenced objects older than its grace period. It
// lists objects before it reads Redis, so the only object it can take from
// a cycle is one that was uploaded before the listing and is committed
// after the read: a cycle whose commit came long after its upload, as when
// Redis is unreachable for a while, or uploads keep failing for one flow
// while another's are done. So a cycle does not commit objects older than
// --max-commit-age: before the commit, if its first object was uploaded
// longer ago than that, it uploads its data and metas again under new names
// (the cycle id with an "-r<N>" suffix) and commits those right after. The
// old objects are never referenced and gc removes them. As long as gc's
// --grace exceeds --max-commit-age plus the time one pass of uploads and one
// commit attempt take, no object gc deletes is ever committed.

// uploaded notes that an object of the cycle was uploaded under its
// current names.
func (cyc *cycle) uploaded() {
	cyc.upMu.Lock()
	if cyc.firstObject.IsZero() {
		cyc.firstObject = time.Now()
	}
	cyc.upMu.Unlock()
}

// refreshStale gives the cycle's objects new names if its first object was
// uploaded more than --max-commit-age ago, so that the next uploadAll writes
// them afresh. It reports whether it did. It runs between uploads, on the
// flusher's goroutine.
func (f *flusher) refreshStale(cyc *cycle) bool {
	limit := f.c.cfg.MaxCommitAge
	cyc.upMu.Lock()
	first := cyc.firstObject
	cyc.upMu.Unlock()
	if limit <= 0 || first.IsZero() || time.Since(first) <= limit {
		return false
	}
	for _, u := range cyc.uploads {
		if u.built { // one not built yet gets fresh names when it is
			f.rename(cyc, u)
		}
	}
	f.c.log.Warn("flush cycle's objects are older than --max-commit-age; uploading them again under new names before the commit",
		"cycle", cyc.id, "first_upload_age", time.Since(first).Round(time.Second), "max_commit_age", limit)
	cyc.upMu.Lock()
	cyc.firstObject = time.Time{}
	cyc.upMu.Unlock()
	return true
}
