package event

// Reasons carried by DecodeError. The set is closed: each value is safe to
// use as a metric label.
const (
	ReasonProto = "proto"  // malformed protobuf ApplyBatch
	ReasonJSON  = "json"   // malformed protojson ApplyBatch
	ReasonCF    = "bad_cf" // column family outside CF
	ReasonOp    = "bad_op" // op outside Op
	ReasonKey   = "key"    // malformed memcomparable key
	ReasonKeyTS = "key_ts" // data key without a decodable ts
	// ReasonBadKey is the DLQ reason of an apply record with a data key
	// whose ts cannot be decoded, or a table key too short for its table id:
	// such a key can be neither ordered nor routed, so the record is kept
	// whole in the DLQ (docs/FORMAT.md, "How an apply record is handled").
	ReasonBadKey = "bad_key"
	ReasonWrite  = "write" // malformed write-CF record
	ReasonFrame  = "frame" // truncated or oversized entry framing
)

// DecodeError reports input that cannot be decoded. Reason is one of the
// Reason constants; Err carries the detail.
type DecodeError struct {
	Reason string
	Err    error
}

// Error returns the reason followed by the detail, so the message can be used
// as a DLQ flowlog-error header whose prefix is the bounded reason.
func (e *DecodeError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *DecodeError) Unwrap() error { return e.Err }

// decodeErr is a small constructor used by every decoder.
func decodeErr(reason string, err error) *DecodeError {
	return &DecodeError{Reason: reason, Err: err}
}
