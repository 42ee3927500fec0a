// Package event holds flowlog's wire formats, described byte for byte in
// docs/FORMAT.md from "ApplyBatch records" to "DLQ records": the ApplyBatch
// records of the apply topic in protobuf and protojson form, the TiKV key
// codec (memcomparable bytes, data keys with an inverted ts, table and meta
// key detection), TSO timestamps, the write-CF record codec, the entry
// framing of temp files and backup chunks, and the DLQ record shape.
//
// The decoders are on the consumer's hot path. DecodeBatch parses protobuf by
// hand and returns events whose keys and values alias the record bytes, so a
// reused Batch decodes without allocating. Every decoder returns a
// *DecodeError whose Reason is a short, bounded label fit for a metric label
// and for the prefix of a DLQ record's flowlog-error header.
package event

//go:generate protoc --go_out=.. --go_opt=paths=source_relative --proto_path=.. ../event/apply.proto
