// Package rebuild brings back flowlog's Redis state from the bucket after
// Redis lost it (docs/OPERATING.md, "Losing Redis"): it reads the layout v2
// catalogs, metas and global checkpoint object (and the v1 metas of flows
// backed up before v2), chooses per apply partition the metas that form the
// chain of committed cycles, plans the Redis keys that describe them, and
// writes them in one MULTI under the prefix (`consumer recover`). It also
// tells whether a bucket prefix holds a backup at all (FindBackup), which
// `consumer run` asks before it claims an empty Redis.
package rebuild
