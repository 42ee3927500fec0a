// Package docs holds flowlog's documentation. Its only code is a test that
// keeps FORMAT.md, the format and protocol reference, true to the code: every
// Redis key family that meta.Keys builds and every kind of object that a
// sink path builder names must be described there, everything the
// reference's key and object tables list must exist in the code, and every
// section the code cites (docs/<PAGE>.md, "<Title>") must exist.
package docs
